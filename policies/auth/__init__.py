"""Tenant identity: API keys (``keys``), bearer JWTs (``jwt_verifier``) and the request-level
``Authenticator`` that combines them with the admin key and model allow-lists."""

from policies.auth.authenticator import Authenticator, bearer_token
from policies.auth.jwt_verifier import (
    JwtVerifier,
    TokenRejected,
    VerificationKeys,
    load_verification_keys,
)
from policies.auth.keys import (
    KeyIndex,
    KeyRecord,
    KeysFile,
    KeysFileError,
    generate_key,
    hash_key,
    parse_key_id,
)

__all__ = [
    "Authenticator",
    "JwtVerifier",
    "KeyIndex",
    "KeyRecord",
    "KeysFile",
    "KeysFileError",
    "TokenRejected",
    "VerificationKeys",
    "bearer_token",
    "generate_key",
    "hash_key",
    "load_verification_keys",
    "parse_key_id",
]
