"""``headrace check`` on the object store: every ``s3://`` location the pipeline writes to is proven
reachable and writable by writing a small probe object there and deleting it, through the same
client the driver uses (``pyarrow.fs``). A failure is one sentence naming the setting to fix.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from headrace import storage
from headrace.storage.s3 import S3Access, split

PROBE_PREFIX = "_headrace_check_"


def location_problems(locations: Iterable[tuple[str, str]]) -> list[str]:
    """One sentence per unusable ``s3://`` location of ``(setting, location)``; [] when all take a probe."""
    problems: list[str] = []
    seen: set[str] = set()
    for setting, location in locations:
        if not storage.is_object_store(location) or location in seen:
            continue
        seen.add(location)
        problem = probe(setting, location)
        if problem:
            problems.append(problem)
            if "cannot reach" in problem or "refused the credentials" in problem:
                break  # the same for every location of the store: said once
    return problems


def probe(setting: str, location: str) -> str | None:
    """Write and delete a probe object under ``location``; the problem in one sentence, or None."""
    access = storage.access()
    try:
        filesystem, path = storage.filesystem(location)
        bucket, _ = split(location)
        target = f"{path}/{PROBE_PREFIX}{uuid.uuid4().hex}"
        with filesystem.open_output_stream(target) as out:
            out.write(b"headrace check\n")
        filesystem.delete_file(target)
    except (OSError, ValueError) as exc:
        return explain(exc, setting, location, bucket if "bucket" in locals() else location, access)
    return None


def explain(exc: BaseException, setting: str, location: str, bucket: str, access: S3Access) -> str:
    """The sentence for an error of the S3 client (pyarrow's messages carry the AWS error's name)."""
    text = str(exc)
    lowered = text.lower()
    if any(s in lowered for s in ("no_such_bucket", "nosuchbucket", "bucket does not exist", "code: 404")) or \
            ("not found" in lowered and "bucket" in lowered):
        return (f"{setting} {location}: bucket {bucket} does not exist at {access.shown_endpoint}: create it,"
                f" or fix the bucket in {setting}")
    if any(s in lowered for s in ("access_denied", "accessdenied", "invalidaccesskeyid", "signaturedoesnotmatch",
                                  "forbidden", "code: 403", "invalid_access_key", "signature")):
        return (f"{setting} {location}: the object store at {access.shown_endpoint} refused the credentials"
                f" (403): set {access.key_setting} to a key that may write to bucket {bucket}")
    if any(s in lowered for s in ("curlcode", "couldn't connect", "could not connect", "connection refused",
                                  "network", "timed out", "timeout", "resolve", "unreachable")):
        return (f"{setting} {location}: cannot reach the object store at {access.shown_endpoint}: fix"
                f" {access.endpoint_setting}")
    return (f"{setting} {location}: the object store at {access.shown_endpoint} refused a test write"
            f" ({text.splitlines()[0][:200]}): check {setting}, {access.endpoint_setting} and {access.key_setting}")
