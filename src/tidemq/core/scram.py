"""SCRAM-SHA-256 (RFC 5802, RFC 7677) as two sans-IO state machines: bytes in, bytes out.

No sockets, no event loop, no clock: the connection code moves each message in a frame and
hands the reply back (docs/design/security.md draws the exchange)::

    client                                   server
    ScramClient.first()         -- n,,n=user,r=cnonce -->  ScramServer.receive_client_first()
    receive_server_first()  <-- r=cnonce+snonce,s=salt,i=4096 --
                            -- c=biws,r=cnonce+snonce,p=proof -->  receive_client_final()
    receive_server_final()  <-- v=signature (or e=invalid-proof) --

The server stores only `Credentials`: salt, iterations, StoredKey and ServerKey. The
password never leaves the client; the proof is good for one exchange only, since it signs
both nonces.

Who owns what: one `ScramClient` or `ScramServer` per connection attempt, used by the one
task that reads that connection. Randomness is injected (a callable like `os.urandom`), so
tests are deterministic. Every refusal raises `ScramError`; after one, the machine is
FAILED and refuses every further step, as it does any step out of order.

Scope: no channel binding (the client sends ``n,,``; the server also accepts ``y,,``,
which is correct for a server that offers no ``-PLUS`` mechanism), no authorization
identity, no extensions. Passwords are prepared with SASLprep (RFC 4013); user names are
compared exactly as sent (after ``=2C``/``=3D`` unescaping), as Kafka does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import stringprep
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Final

__all__ = [
    "DEFAULT_ITERATIONS",
    "MAX_ITERATIONS",
    "MAX_MESSAGE_BYTES",
    "MAX_NONCE_CHARS",
    "MAX_SALT_BYTES",
    "MAX_USERNAME_BYTES",
    "MECHANISM",
    "MIN_ITERATIONS",
    "MIN_MOCK_SECRET_BYTES",
    "MIN_NONCE_CHARS",
    "MIN_SALT_BYTES",
    "NONCE_CHARS",
    "SALT_BYTES",
    "ClientState",
    "Credentials",
    "CredentialsLookup",
    "RandomBytes",
    "ScramClient",
    "ScramError",
    "ScramServer",
    "ServerState",
    "escape_username",
    "make_credentials",
    "new_salt",
    "saslprep",
    "unescape_username",
]

#: The SASL mechanism name, as a client asks for it.
MECHANISM: Final = "SCRAM-SHA-256"

# Limits, each with its reason.
#: RFC 7677 section 4: at least 4096 iterations (Kafka's default too). Both sides refuse
#: fewer: a fake server offering i=1 would otherwise get a proof cheap to brute-force.
MIN_ITERATIONS: Final = 4096
#: Iterations for new credentials unless the operator asks for more; the same number is
#: used for the fake credentials of unknown users, so that both look alike.
DEFAULT_ITERATIONS: Final = 4096
#: A client derives the salted password with this many iterations at most: a hostile server
#: cannot make it spin for minutes. One million PBKDF2-HMAC-SHA256 rounds take about 0.5 s
#: in hashlib (OpenSSL), above OWASP's 2023 advice of 600,000.
MAX_ITERATIONS: Final = 1_000_000
#: Fresh salts are 16 bytes (RFC 7677's example; NIST SP 800-132 asks for at least 128 bits).
SALT_BYTES: Final = 16
#: Salts shorter than 8 bytes defeat the point of salting; longer than 128 is not a salt.
MIN_SALT_BYTES: Final = 8
MAX_SALT_BYTES: Final = 128
#: Each side's nonce: 24 printable characters (about 157 bits: 93 symbols each), by
#: default; never fewer than 16 (104 bits: no two exchanges ever share one).
NONCE_CHARS: Final = 24
MIN_NONCE_CHARS: Final = 16
#: A peer's nonce longer than this is refused (bounded work and memory before auth).
MAX_NONCE_CHARS: Final = 256
#: A user name in UTF-8 (before escaping): a principal `User:<name>` fits in logs and ACLs.
MAX_USERNAME_BYTES: Final = 255
#: Any one SCRAM message. The longest legitimate one is a client-first with a fully escaped
#: user name (3 x 255) and a long nonce, under 1.1 KiB; the pre-auth frame limit (64 KiB,
#: reliability.md section 6) is far above, so this is the bound that applies.
MAX_MESSAGE_BYTES: Final = 2048
#: The unknown-user secret must be long enough that its fake salts cannot be predicted.
MIN_MOCK_SECRET_BYTES: Final = 16
#: Random draws while building a nonce. Each draw asks for the characters still missing
#: and keeps about 93 in 256 of them, so a nonce takes about 6 draws; the chance that a
#: good source still misses one after 256 draws is below (163/256)^256 < 10^-50. More
#: draws means a broken source (one that returns only unusable bytes).
_MAX_NONCE_DRAWS: Final = 256

_KEY_BYTES: Final = hashlib.sha256().digest_size
_GS2_HEADER: Final = "n,,"
_ITERATIONS: Final = re.compile(r"[1-9][0-9]{0,9}")

#: A source of random bytes: called with a count, returns that many bytes (os.urandom).
RandomBytes = Callable[[int], bytes]


class ScramError(ValueError):
    """An exchange refused: a malformed or out-of-order message, a bad proof, a bad server
    signature. `server_error` is RFC 5802's server-error-value for the ``e=`` reply the
    server sends (`reply`); it never says whether the user exists."""

    def __init__(self, message: str, *, server_error: str = "other-error") -> None:
        super().__init__(message)
        self.server_error = server_error

    @property
    def reply(self) -> bytes:
        """The server-final message that reports this failure to the client."""
        return f"e={self.server_error}".encode()


@dataclass(frozen=True)
class Credentials:
    """What the server stores for one user: never the password, nor anything a client
    could replay (StoredKey is the hash of the ClientKey, not the key)."""

    salt: bytes
    iterations: int
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        _check_salt(self.salt)
        _check_iterations(self.iterations)
        if len(self.stored_key) != _KEY_BYTES or len(self.server_key) != _KEY_BYTES:
            raise ScramError(f"stored and server keys must be {_KEY_BYTES} bytes")


#: Finds a user's credentials; None for an unknown user (e.g. `dict.get`).
CredentialsLookup = Callable[[str], Credentials | None]


def make_credentials(
    password: str, salt: bytes, iterations: int = DEFAULT_ITERATIONS
) -> Credentials:
    """The credentials to store for `password` (SASLprep'd, RFC 4013)."""
    _check_salt(salt)
    _check_iterations(iterations)
    salted = _salted_password(saslprep(password), salt, iterations)
    return Credentials(
        salt=salt,
        iterations=iterations,
        stored_key=hashlib.sha256(_hmac(salted, b"Client Key")).digest(),
        server_key=_hmac(salted, b"Server Key"),
    )


def new_salt(random_bytes: RandomBytes) -> bytes:
    """A fresh salt for `make_credentials`."""
    return _draw(random_bytes, SALT_BYTES)


def escape_username(name: str) -> str:
    """RFC 5802 saslname: "=" becomes "=3D" and "," becomes "=2C" (in that order)."""
    return name.replace("=", "=3D").replace(",", "=2C")


def unescape_username(saslname: str) -> str:
    """The inverse of `escape_username`; any other "=" sequence is refused."""
    if re.search(r"=(?!2C|3D)", saslname) is not None:
        raise ScramError("user name has a bad '=' escape", server_error="invalid-username-encoding")
    return saslname.replace("=2C", ",").replace("=3D", "=")


def saslprep(text: str) -> str:
    """RFC 4013 SASLprep for stored strings: map, NFKC, refuse prohibited, bidi-check and
    unassigned code points (Unicode 3.2, as stringprep requires)."""
    mapped = "".join(
        " " if stringprep.in_table_c12(c) else c for c in text if not stringprep.in_table_b1(c)
    )
    prepared = unicodedata.ucd_3_2_0.normalize("NFKC", mapped)
    if not prepared:
        raise ScramError("password is empty")
    for c in prepared:
        if _prohibited(c):
            raise ScramError(f"password contains a prohibited character U+{ord(c):04X}")
    if any(stringprep.in_table_d1(c) for c in prepared) and (
        any(stringprep.in_table_d2(c) for c in prepared)
        or not stringprep.in_table_d1(prepared[0])
        or not stringprep.in_table_d1(prepared[-1])
    ):
        raise ScramError("password mixes right-to-left and left-to-right text")
    return prepared


class ClientState(Enum):
    INITIAL = auto()
    SENT_FIRST = auto()
    SENT_FINAL = auto()
    DONE = auto()
    FAILED = auto()


class ServerState(Enum):
    INITIAL = auto()
    SENT_FIRST = auto()
    DONE = auto()
    FAILED = auto()


class _Step(Enum):
    FIRST = auto()
    SERVER_FIRST = auto()
    SERVER_FINAL = auto()
    CLIENT_FIRST = auto()
    CLIENT_FINAL = auto()


# Transitions as data: (state, step) -> next state. Anything else is out of order.
_CLIENT_TRANSITIONS: Final = {
    (ClientState.INITIAL, _Step.FIRST): ClientState.SENT_FIRST,
    (ClientState.SENT_FIRST, _Step.SERVER_FIRST): ClientState.SENT_FINAL,
    (ClientState.SENT_FINAL, _Step.SERVER_FINAL): ClientState.DONE,
}
_SERVER_TRANSITIONS: Final = {
    (ServerState.INITIAL, _Step.CLIENT_FIRST): ServerState.SENT_FIRST,
    (ServerState.SENT_FIRST, _Step.CLIENT_FINAL): ServerState.DONE,
}


class ScramClient:
    """The client side of one exchange: `first()`, then `receive_server_first()`, then
    `receive_server_final()`; DONE means the server proved it knows the credentials."""

    def __init__(
        self,
        username: str,
        password: str,
        *,
        random_bytes: RandomBytes,
        nonce_chars: int = NONCE_CHARS,
    ) -> None:
        _check_username(username)
        self._username = username
        self._password = saslprep(password)  # a bad password fails here, before any traffic
        self._nonce = _nonce(random_bytes, nonce_chars)
        self._state = ClientState.INITIAL
        self._server_signature = b""

    @property
    def state(self) -> ClientState:
        return self._state

    def first(self) -> bytes:
        """The client-first message: ``n,,n=<saslname>,r=<nonce>``."""
        self._advance(_Step.FIRST)
        return (_GS2_HEADER + self._first_bare()).encode()

    def receive_server_first(self, message: bytes) -> bytes:
        """Checks the server-first message and returns the client-final one (with proof)."""
        self._advance(_Step.SERVER_FIRST)
        try:
            server_first = _text(message)
            nonce, salt_text, iterations_text = _fields(server_first, "rsi")
            if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
                raise ScramError("server nonce does not extend the client nonce")
            _check_nonce(nonce[len(self._nonce) :])
            salt = _b64decode(salt_text)
            _check_salt(salt)
            iterations = _parse_iterations(iterations_text)
            salted = _salted_password(self._password, salt, iterations)
            without_proof = f"c={_b64(_GS2_HEADER.encode())},r={nonce}"
            auth_message = f"{self._first_bare()},{server_first},{without_proof}".encode()
            client_key = _hmac(salted, b"Client Key")
            stored_key = hashlib.sha256(client_key).digest()
            proof = _xor(client_key, _hmac(stored_key, auth_message))
            self._server_signature = _hmac(_hmac(salted, b"Server Key"), auth_message)
        except ScramError:
            self._state = ClientState.FAILED
            raise
        return f"{without_proof},p={_b64(proof)}".encode()

    def receive_server_final(self, message: bytes) -> None:
        """Checks the server's signature; raises ScramError on ``e=`` or a bad signature."""
        self._advance(_Step.SERVER_FINAL)
        try:
            text = _text(message)
            if text.startswith("e="):
                raise ScramError(f"server refused the login: {text[2:]}", server_error=text[2:])
            (verifier,) = _fields(text, "v")
            if not hmac.compare_digest(_b64decode(verifier), self._server_signature):
                raise ScramError("server signature does not match: not the expected server")
        except ScramError:
            self._state = ClientState.FAILED
            raise

    def _first_bare(self) -> str:
        return f"n={escape_username(self._username)},r={self._nonce}"

    def _advance(self, step: _Step) -> None:
        after = _CLIENT_TRANSITIONS.get((self._state, step))
        if after is None:
            was, self._state = self._state, ClientState.FAILED
            raise ScramError(f"SCRAM step {step.name} out of order in state {was.name}")
        self._state = after


class ScramServer:
    """The server side of one exchange: `receive_client_first()` returns the server-first
    message, `receive_client_final()` the server-final one; then `username` is the
    authenticated user.

    An unknown user goes through the same steps as a known one with fake credentials: a
    salt derived from `mock_secret` and the name (stable, as a real user's is), the
    default iterations, and keys no proof can match. The refusal is the same
    ``e=invalid-proof`` with the same text, so the exchange never tells whether the user
    exists. `mock_secret` should be one random value per broker (32 bytes), not per
    connection, or the fake salt would change between attempts while a real one does not.
    """

    def __init__(
        self,
        credentials: CredentialsLookup,
        *,
        random_bytes: RandomBytes,
        mock_secret: bytes,
        mock_iterations: int = DEFAULT_ITERATIONS,
        nonce_chars: int = NONCE_CHARS,
    ) -> None:
        if len(mock_secret) < MIN_MOCK_SECRET_BYTES:
            raise ScramError(f"mock_secret must be at least {MIN_MOCK_SECRET_BYTES} bytes")
        _check_iterations(mock_iterations)
        _check_nonce_chars(nonce_chars)
        self._nonce_chars = nonce_chars
        self._lookup = credentials
        self._random_bytes = random_bytes
        self._mock_secret = mock_secret
        self._mock_iterations = mock_iterations
        self._state = ServerState.INITIAL
        self._username = ""
        self._credentials: Credentials | None = None
        self._nonce = ""
        self._gs2_header = ""
        self._first_bare = ""
        self._server_first = ""

    @property
    def state(self) -> ServerState:
        return self._state

    @property
    def username(self) -> str:
        """The authenticated user; only once the exchange is DONE."""
        if self._state is not ServerState.DONE:
            raise ScramError("no user is authenticated: the exchange has not succeeded")
        return self._username

    def receive_client_first(self, message: bytes) -> bytes:
        """Parses the client-first message and returns the server-first one."""
        self._advance(_Step.CLIENT_FIRST)
        try:
            text = _text(message)
            gs2_header, bare = _split_gs2(text)
            if bare.startswith("m="):
                raise ScramError(
                    "SCRAM extensions are not supported", server_error="extensions-not-supported"
                )
            saslname, client_nonce = _fields(bare, "nr")
            username = unescape_username(saslname)
            _check_username(username, server_error="invalid-username-encoding")
            _check_nonce(client_nonce)
            # The fake credentials are made for every user, known or not, so that the two
            # cases take the same steps and the same time.
            mock = self._mock(username)
            found = self._lookup(username)
            self._credentials = found if found is not None else mock
            self._username = username
            self._gs2_header = gs2_header
            self._first_bare = bare
            self._nonce = client_nonce + _nonce(self._random_bytes, self._nonce_chars)
            salt = _b64(self._credentials.salt)
            self._server_first = f"r={self._nonce},s={salt},i={self._credentials.iterations}"
        except ScramError:
            self._state = ServerState.FAILED
            raise
        return self._server_first.encode()

    def receive_client_final(self, message: bytes) -> bytes:
        """Checks the client's proof; returns ``v=<server signature>``. On a bad proof
        raises ScramError whose `reply` is ``e=invalid-proof``."""
        self._advance(_Step.CLIENT_FINAL)
        try:
            text = _text(message)
            binding, nonce, proof_text = _fields(text, "crp")
            if _b64decode(binding) != self._gs2_header.encode():
                raise ScramError(
                    "channel binding differs from the client-first header",
                    server_error="channel-bindings-dont-match",
                )
            if not hmac.compare_digest(nonce.encode(), self._nonce.encode()):
                raise ScramError("nonce differs from this exchange's nonce")
            proof = _b64decode(proof_text)
            credentials = self._credentials
            assert credentials is not None  # set by receive_client_first
            without_proof = text[: text.rindex(",p=")]
            auth = f"{self._first_bare},{self._server_first},{without_proof}".encode()
            signature = _hmac(credentials.stored_key, auth)
            # A proof of the wrong length still goes through the comparison (of a key of
            # the right length), so that no step is skipped that a good one would take.
            client_key = _xor(proof, signature) if len(proof) == _KEY_BYTES else bytes(_KEY_BYTES)
            matched = hmac.compare_digest(
                hashlib.sha256(client_key).digest(), credentials.stored_key
            )
            if not matched or len(proof) != _KEY_BYTES:
                raise ScramError("authentication failed", server_error="invalid-proof")
            verifier = _b64(_hmac(credentials.server_key, auth))
        except ScramError:
            self._state = ServerState.FAILED
            raise
        return f"v={verifier}".encode()

    def _mock(self, username: str) -> Credentials:
        name = username.encode()
        return Credentials(
            salt=_hmac(self._mock_secret, b"salt:" + name)[:SALT_BYTES],
            iterations=self._mock_iterations,
            # HMAC outputs: no ClientKey hashes to them except by a SHA-256 preimage.
            stored_key=_hmac(self._mock_secret, b"stored:" + name),
            server_key=_hmac(self._mock_secret, b"server:" + name),
        )

    def _advance(self, step: _Step) -> None:
        after = _SERVER_TRANSITIONS.get((self._state, step))
        if after is None:
            was, self._state = self._state, ServerState.FAILED
            raise ScramError(f"SCRAM step {step.name} out of order in state {was.name}")
        self._state = after


def _split_gs2(text: str) -> tuple[str, str]:
    """(gs2 header with its trailing comma, client-first-bare)."""
    parts = text.split(",", 2)
    if len(parts) != 3:
        raise ScramError("client-first message is malformed", server_error="invalid-encoding")
    flag, authzid, bare = parts
    if flag.startswith("p="):
        raise ScramError(
            "channel binding is not supported", server_error="channel-binding-not-supported"
        )
    if flag not in ("n", "y"):
        raise ScramError("bad channel-binding flag", server_error="invalid-encoding")
    if authzid:
        raise ScramError("an authorization identity is not supported")
    return f"{flag},,", bare


def _fields(text: str, names: str) -> list[str]:
    """The values of exactly the attributes `names`, in that order (``r=..,s=..``)."""
    parts = text.split(",")
    if len(parts) > len(names) and all(
        p[:2] == f"{n}=" for p, n in zip(parts, names, strict=False)
    ):
        raise ScramError(
            "SCRAM extensions are not supported", server_error="extensions-not-supported"
        )
    if len(parts) != len(names) or any(p[:2] != f"{n}=" for p, n in zip(parts, names, strict=True)):
        raise ScramError(
            f"expected attributes {','.join(names)} in this message",
            server_error="invalid-encoding",
        )
    return [p[2:] for p in parts]


def _text(message: bytes) -> str:
    if len(message) > MAX_MESSAGE_BYTES:
        raise ScramError(
            f"SCRAM message longer than {MAX_MESSAGE_BYTES} bytes", server_error="invalid-encoding"
        )
    try:
        return bytes(message).decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("SCRAM message is not UTF-8", server_error="invalid-encoding") from None


def _check_username(name: str, *, server_error: str = "other-error") -> None:
    if not name:
        raise ScramError("user name is empty", server_error=server_error)
    if len(name.encode(errors="surrogatepass")) > MAX_USERNAME_BYTES:
        raise ScramError(
            f"user name longer than {MAX_USERNAME_BYTES} bytes", server_error=server_error
        )
    if not name.isprintable():
        raise ScramError("user name contains an unprintable character", server_error=server_error)


def _check_nonce(nonce: str) -> None:
    if not 0 < len(nonce) <= MAX_NONCE_CHARS or not all(_printable(c) for c in nonce):
        raise ScramError(
            f"nonce must be 1-{MAX_NONCE_CHARS} printable ASCII characters other than ','",
            server_error="invalid-encoding",
        )


def _check_salt(salt: bytes) -> None:
    if not MIN_SALT_BYTES <= len(salt) <= MAX_SALT_BYTES:
        raise ScramError(f"salt must be {MIN_SALT_BYTES}-{MAX_SALT_BYTES} bytes")


def _check_iterations(iterations: int) -> None:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ScramError(f"iterations must be {MIN_ITERATIONS}-{MAX_ITERATIONS}, not {iterations}")


def _parse_iterations(text: str) -> int:
    if _ITERATIONS.fullmatch(text) is None:
        raise ScramError("iteration count is not a number")
    iterations = int(text)
    _check_iterations(iterations)
    return iterations


def _printable(c: str) -> bool:
    """RFC 5802 `printable`: %x21-2B / %x2D-7E (visible ASCII but ',')."""
    return "!" <= c <= "~" and c != ","


def _check_nonce_chars(count: int) -> None:
    if not MIN_NONCE_CHARS <= count <= MAX_NONCE_CHARS:
        raise ScramError(f"nonces must be {MIN_NONCE_CHARS}-{MAX_NONCE_CHARS} characters")


def _nonce(random_bytes: RandomBytes, count: int) -> str:
    """`count` characters drawn without bias: random bytes that are `printable` are kept,
    the others dropped (so a source of printable bytes gives exactly those back)."""
    _check_nonce_chars(count)
    chars: list[str] = []
    for _ in range(_MAX_NONCE_DRAWS):
        chars.extend(
            c for c in _draw(random_bytes, count - len(chars)).decode("latin-1") if _printable(c)
        )
        if len(chars) == count:
            return "".join(chars)
    raise ScramError("the random source gives no usable bytes")


def _draw(random_bytes: RandomBytes, count: int) -> bytes:
    data = random_bytes(count)
    if len(data) != count:
        raise ScramError(f"the random source returned {len(data)} bytes, not {count}")
    return data


def _prohibited(c: str) -> bool:
    return (
        stringprep.in_table_c12(c)
        or stringprep.in_table_c21_c22(c)
        or stringprep.in_table_c3(c)
        or stringprep.in_table_c4(c)
        or stringprep.in_table_c5(c)
        or stringprep.in_table_c6(c)
        or stringprep.in_table_c7(c)
        or stringprep.in_table_c8(c)
        or stringprep.in_table_c9(c)
        or stringprep.in_table_a1(c)
    )


def _salted_password(prepared_password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", prepared_password.encode(), salt, iterations)


def _hmac(key: bytes, data: bytes) -> bytes:
    return hmac.digest(key, data, "sha256")


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ScramError("bad base64 in SCRAM message", server_error="invalid-encoding") from None
