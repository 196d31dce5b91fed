"""The ``storage:`` section: how every engine reaches the S3-compatible object store that ``s3://``
paths (``staging.path``, an Iceberg ``warehouse``, a DuckLake ``data_path``) name.

Nothing in it is needed on AWS with the standard environment: like the AWS CLI and boto3, an unset
setting falls back to ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, ``AWS_REGION`` /
``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_SESSION_TOKEN``.
Secrets are only ever read from the environment (``*_env`` keys name the variables).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from headrace.core.settings import Frozen


class StorageConfig(Frozen):
    """An S3-compatible object store (AWS S3, MinIO, Ceph, R2, ...)."""

    endpoint: str | None = Field(
        None, description="the store's URL (http://127.0.0.1:9000 for MinIO, https://... for others); unset:"
        " AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else AWS S3 itself"
    )
    region: str | None = Field(
        None, description="the region the buckets are in; unset: AWS_REGION or AWS_DEFAULT_REGION, else us-east-1"
    )
    path_style: bool | None = Field(
        None, description="path-style addressing (http://host/bucket/key) instead of virtual-hosted"
        " (http://bucket.host/key); unset: path-style for an endpoint on an IP address or localhost"
        " (MinIO and most self-hosted stores), virtual-hosted otherwise"
    )
    access_key_id_env: str = Field(
        "AWS_ACCESS_KEY_ID", description="environment variable holding the access key id; when it is not set"
        " each engine's default credential chain is used (instance profile, web identity, ...)"
    )
    secret_access_key_env: str = Field(
        "AWS_SECRET_ACCESS_KEY", description="environment variable holding the secret access key"
    )
    session_token_env: str = Field(
        "AWS_SESSION_TOKEN", description="environment variable holding a session token (temporary credentials)"
    )
    s3a_jars: str | None = Field(
        None, description="folder with the hadoop-aws and aws-java-sdk-bundle jars Spark's S3A filesystem"
        " needs; unset: HEADRACE_S3A_JARS, else the virtualenv's share/headrace/s3a (scripts/bootstrap.sh"
        " puts them there); not needed when spark.conf sets spark.jars.packages to org.apache.hadoop:hadoop-aws"
    )

    @field_validator("endpoint")
    @classmethod
    def _url(cls, endpoint: str | None) -> str | None:
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must be a URL starting with http:// or https://, got {endpoint!r}")
        return endpoint.rstrip("/") if endpoint else endpoint
