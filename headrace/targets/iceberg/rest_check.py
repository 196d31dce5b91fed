"""``headrace check`` on an Iceberg REST catalog: it answers, and takes the credentials (a bearer token,
or OAuth2 client credentials exchanged for one), before a run depends on it. One sentence naming the
setting to fix; the token and the secret are never in it."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

from headrace.core.errors import HeadraceError
from headrace.targets.iceberg.config import IcebergConfig

TIMEOUT_SECONDS = 10


def rest_catalog_problems(settings: IcebergConfig) -> list[str]:
    """[] when the catalog answers ``GET /v1/config`` with the configured credentials; else the problem."""
    catalog = settings.catalog
    try:
        uri = catalog.resolved_uri().rstrip("/")
        auth = catalog.rest_auth()
    except HeadraceError as exc:
        return [str(exc)]
    setting = "target.iceberg.catalog.uri" + ("_env" if catalog.uri_env else "")
    token = auth.get("token")
    if "credential" in auth:
        client_id, _, secret = auth["credential"].partition(":")
        form = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret}
        if catalog.scope:
            form["scope"] = catalog.scope
        token_uri = catalog.oauth2_server_uri or f"{uri}/v1/oauth/tokens"
        try:
            answer = _call(urllib.request.Request(token_uri, data=urllib.parse.urlencode(form).encode()))
            token = str(json.loads(answer)["access_token"])
        except urllib.error.HTTPError as exc:
            if exc.code in (400, 401, 403):
                return [f"target.iceberg.catalog: the OAuth2 server at {token_uri} refused the client credentials"
                        f" ({exc.code}): set {catalog.credential_env} to a valid client_id:client_secret"]
            return [f"target.iceberg.catalog: the OAuth2 server at {token_uri} answered {exc.code}: check"
                    " target.iceberg.catalog.oauth2_server_uri"]
        except (OSError, ValueError, KeyError):
            return [f"target.iceberg.catalog: cannot get a token from {token_uri}: fix {setting}"
                    " (or target.iceberg.catalog.oauth2_server_uri)"]
    request = urllib.request.Request(f"{uri}/v1/config")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        _call(request)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403, 419):
            what = (f"set {catalog.token_env} to a valid, unexpired token" if catalog.token_env else
                    f"check the client's rights ({catalog.credential_env})" if catalog.credential_env else
                    "give the catalog's credentials: target.iceberg.catalog.token_env or credential_env")
            return [f"target.iceberg.catalog: the REST catalog at {uri} refused the request ({exc.code},"
                    f" not authorized): {what}"]
        return [f"target.iceberg.catalog: the REST catalog at {uri} answered {exc.code} to GET /v1/config:"
                f" check {setting} (the base URL, without /v1)"]
    except (OSError, ValueError):
        return [f"target.iceberg.catalog: cannot reach the REST catalog at {uri}: fix {setting}"]
    return []


def _call(request: urllib.request.Request) -> bytes:
    with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as answer:
        return bytes(answer.read())
