"""SCRAM-SHA-256 state machines (core/scram.py): RFC 7677's test vector, refusals, and
round trips against a small reference computation of RFC 5802 written here."""

from __future__ import annotations

import base64
import hashlib
import hmac
import random
from collections.abc import Callable

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tidemq.core import scram
from tidemq.core.scram import (
    ClientState,
    Credentials,
    ScramClient,
    ScramError,
    ScramServer,
    ServerState,
    escape_username,
    make_credentials,
    saslprep,
    unescape_username,
)

# RFC 7677 section 3.
RFC_CLIENT_NONCE = b"rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = b"%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

MOCK_SECRET = bytes(range(32))


def replay(data: bytes) -> Callable[[int], bytes]:
    """A random source that hands out `data` in order (and fails when it runs out)."""
    rest = bytearray(data)

    def random_bytes(count: int) -> bytes:
        assert len(rest) >= count, "the test's random source ran out"
        out = bytes(rest[:count])
        del rest[:count]
        return out

    return random_bytes


def seeded(seed: int) -> Callable[[int], bytes]:
    return random.Random(seed).randbytes


def rfc_pair() -> tuple[ScramClient, ScramServer]:
    client = ScramClient(
        "user", "pencil", random_bytes=replay(RFC_CLIENT_NONCE), nonce_chars=len(RFC_CLIENT_NONCE)
    )
    server = ScramServer(
        {"user": make_credentials("pencil", RFC_SALT, 4096)}.get,
        random_bytes=replay(RFC_SERVER_NONCE),
        mock_secret=MOCK_SECRET,
        nonce_chars=len(RFC_SERVER_NONCE),
    )
    return client, server


def server_for(users: dict[str, Credentials], seed: int = 1) -> ScramServer:
    return ScramServer(users.get, random_bytes=seeded(seed), mock_secret=MOCK_SECRET)


def login(client: ScramClient, server: ScramServer) -> None:
    """One whole exchange; raises ScramError where either side refuses."""
    final = server.receive_client_first(client.first())
    proof = client.receive_server_first(final)
    client.receive_server_final(server.receive_client_final(proof))


def refusal(client: ScramClient, server: ScramServer) -> ScramError:
    """The server's refusal of the client's proof."""
    client_final = client.receive_server_first(server.receive_client_first(client.first()))
    with pytest.raises(ScramError) as refused:
        server.receive_client_final(client_final)
    return refused.value


def reference_proof(password: str, salt: bytes, iterations: int, auth: bytes) -> bytes:
    """RFC 5802 section 3, spelled out independently of the module."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth, hashlib.sha256).digest()
    return bytes(a ^ b for a, b in zip(client_key, signature, strict=True))


# RFC 7677's example, message by message.


def test_rfc7677_vector_message_by_message() -> None:
    client, server = rfc_pair()
    assert client.first() == RFC_CLIENT_FIRST
    assert server.receive_client_first(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert client.receive_server_first(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    assert server.receive_client_final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    client.receive_server_final(RFC_SERVER_FINAL)
    assert client.state is ClientState.DONE
    assert server.state is ServerState.DONE
    assert server.username == "user"


def test_stored_credentials_hold_no_password_and_hide_keys_in_repr() -> None:
    credentials = make_credentials("pencil", RFC_SALT, 4096)
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", RFC_SALT, 4096)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    assert credentials.stored_key == hashlib.sha256(client_key).digest()
    assert credentials.server_key == hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    assert "pencil" not in repr(credentials)
    assert credentials.stored_key.hex() not in repr(credentials)
    assert "iterations=4096" in repr(credentials)


# Refusals.


def test_wrong_password_is_refused_with_invalid_proof() -> None:
    server = server_for({"user": make_credentials("pencil", RFC_SALT)})
    client = ScramClient("user", "pencil!", random_bytes=seeded(2))
    refused = refusal(client, server)
    assert refused.server_error == "invalid-proof"
    assert refused.reply == b"e=invalid-proof"
    assert server.state is ServerState.FAILED
    with pytest.raises(ScramError, match="server refused the login: invalid-proof"):
        client.receive_server_final(refused.reply)
    assert client.state is ClientState.FAILED


def test_unknown_user_is_indistinguishable_from_a_wrong_password() -> None:
    users = {"alice": make_credentials("right", scram.new_salt(seeded(3)))}
    wrong = refusal(ScramClient("alice", "wrong", random_bytes=seeded(4)), server_for(users))
    unknown = refusal(ScramClient("mallory", "wrong", random_bytes=seeded(4)), server_for(users))
    assert (str(unknown), unknown.server_error, unknown.reply) == (
        str(wrong),
        wrong.server_error,
        wrong.reply,
    )


def test_unknown_user_gets_a_stable_fake_salt_like_a_real_user() -> None:
    def server_first(name: str, seed: int) -> dict[str, str]:
        client = ScramClient(name, "pw", random_bytes=seeded(seed))
        message = server_for({}, seed).receive_client_first(client.first()).decode()
        return dict(part.split("=", 1) for part in message.split(","))

    first, again, other = server_first("ghost", 5), server_first("ghost", 6), server_first("x", 5)
    assert first["s"] == again["s"]  # a real user's salt does not change either
    assert first["s"] != other["s"]
    assert len(base64.b64decode(first["s"])) == scram.SALT_BYTES
    assert first["i"] == str(scram.DEFAULT_ITERATIONS)


def test_tampered_nonce_is_refused_by_the_server() -> None:
    client, server = rfc_pair()
    server.receive_client_first(client.first())
    client_final = client.receive_server_first(RFC_SERVER_FIRST)
    tampered = client_final.replace(b"k0,p=", b"k1,p=")
    with pytest.raises(ScramError, match="nonce differs"):
        server.receive_client_final(tampered)
    assert server.state is ServerState.FAILED


def test_client_refuses_a_server_nonce_that_does_not_extend_its_own() -> None:
    client, _ = rfc_pair()
    client.first()
    with pytest.raises(ScramError, match="does not extend"):
        client.receive_server_first(RFC_SERVER_FIRST.replace(b"r=rOpr", b"r=XOpr"))
    client, _ = rfc_pair()
    client.first()
    with pytest.raises(ScramError, match="does not extend"):
        client.receive_server_first(b"r=rOprNGfwEbeRWgbNEkqO,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")


def test_replayed_client_final_is_refused() -> None:
    client, server = rfc_pair()
    login(client, server)
    # To the same server: the exchange is over, and any further step is out of order.
    with pytest.raises(ScramError, match="out of order"):
        server.receive_client_final(RFC_CLIENT_FINAL)
    assert server.state is ServerState.FAILED
    # To a fresh exchange: its server nonce is new, so the recorded proof signs the wrong one.
    fresh = server_for({"user": make_credentials("pencil", RFC_SALT, 4096)}, seed=9)
    fresh.receive_client_first(RFC_CLIENT_FIRST)
    with pytest.raises(ScramError, match="nonce differs"):
        fresh.receive_client_final(RFC_CLIENT_FINAL)


@pytest.mark.parametrize(
    "steps",
    [
        ["final"],
        ["first", "first"],
        ["first", "final", "final"],
    ],
)
def test_server_refuses_steps_out_of_order(steps: list[str]) -> None:
    client, server = rfc_pair()
    messages = {"first": RFC_CLIENT_FIRST, "final": RFC_CLIENT_FINAL}
    call = {"first": server.receive_client_first, "final": server.receive_client_final}
    for step in steps[:-1]:
        call[step](messages[step])
    with pytest.raises(ScramError, match="out of order"):
        call[steps[-1]](messages[steps[-1]])
    assert server.state is ServerState.FAILED
    with pytest.raises(ScramError):
        _ = server.username
    del client


def test_client_refuses_steps_out_of_order() -> None:
    client, _ = rfc_pair()
    with pytest.raises(ScramError, match="out of order"):
        client.receive_server_first(RFC_SERVER_FIRST)
    assert client.state is ClientState.FAILED
    with pytest.raises(ScramError, match="out of order"):
        client.first()


def test_client_refuses_a_server_that_does_not_know_the_credentials() -> None:
    client, server = rfc_pair()
    server.receive_client_first(client.first())
    client.receive_server_first(RFC_SERVER_FIRST)
    forged = b"v=" + base64.b64encode(bytes(32))
    with pytest.raises(ScramError, match="server signature does not match"):
        client.receive_server_final(forged)
    assert client.state is ClientState.FAILED


@pytest.mark.parametrize(
    ("server_first", "problem"),
    [
        (RFC_SERVER_FIRST.replace(b"i=4096", b"i=4095"), "iterations must be"),
        (RFC_SERVER_FIRST.replace(b"i=4096", b"i=1"), "iterations must be"),
        (RFC_SERVER_FIRST.replace(b"i=4096", b"i=99999999"), "iterations must be"),
        (RFC_SERVER_FIRST.replace(b"i=4096", b"i=04096"), "not a number"),
        (RFC_SERVER_FIRST.replace(b"i=4096", b"i=\xd9\xa4"), "not a number"),
        (RFC_SERVER_FIRST.replace(b"s=W22ZaJ0SNY7soEsUEjb6gQ==", b"s=AAAA"), "salt must be"),
        (RFC_SERVER_FIRST.replace(b"s=W22Z", b"s=W!2Z"), "bad base64"),
        (RFC_SERVER_FIRST + b",x=1", "extensions are not supported"),
        (b"m=x," + RFC_SERVER_FIRST, "expected attributes r,s,i"),
        (RFC_SERVER_FIRST[: -len(b",i=4096")], "expected attributes r,s,i"),
        (b"r=" + RFC_CLIENT_NONCE + b"x" * 300 + b",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", "nonce"),
    ],
)
def test_client_refuses_a_bad_server_first(server_first: bytes, problem: str) -> None:
    client, _ = rfc_pair()
    client.first()
    with pytest.raises(ScramError, match=problem):
        client.receive_server_first(server_first)
    assert client.state is ClientState.FAILED


@pytest.mark.parametrize(
    ("client_first", "server_error"),
    [
        (b"p=tls-unique,,n=user,r=abc", "channel-binding-not-supported"),
        (b"x,,n=user,r=abc", "invalid-encoding"),
        (b"n,a=admin,n=user,r=abc", "other-error"),
        (b"n,,m=ext,n=user,r=abc", "extensions-not-supported"),
        (b"n,,n=user,r=abc,x=1", "extensions-not-supported"),
        (b"n,,r=abc,n=user", "invalid-encoding"),
        (b"n,,n=us=2Xer,r=abc", "invalid-username-encoding"),
        (b"n,,n=,r=abc", "invalid-username-encoding"),
        (b"n,,n=us\x01er,r=abc", "invalid-username-encoding"),
        (b"n,,n=" + b"u" * 256 + b",r=abc", "invalid-username-encoding"),
        (b"n,,n=user,r=", "invalid-encoding"),
        (b"n,,n=user,r=ab c", "invalid-encoding"),
        (b"n,,n=\xff,r=abc", "invalid-encoding"),
        (b"n,,n=user", "invalid-encoding"),
        (b"n,,n=user,r=" + b"a" * scram.MAX_MESSAGE_BYTES, "invalid-encoding"),
    ],
)
def test_server_refuses_a_bad_client_first(client_first: bytes, server_error: str) -> None:
    server = server_for({"user": make_credentials("pencil", RFC_SALT)})
    with pytest.raises(ScramError) as refused:
        server.receive_client_first(client_first)
    assert refused.value.server_error == server_error
    assert server.state is ServerState.FAILED


@pytest.mark.parametrize(
    ("client_final", "server_error"),
    [
        (RFC_CLIENT_FINAL.replace(b"c=biws", b"c=eSws"), "channel-bindings-dont-match"),
        (RFC_CLIENT_FINAL.replace(b"c=biws", b"c=b!ws"), "invalid-encoding"),
        (RFC_CLIENT_FINAL.replace(b"p=dHzb", b"p=AHzb"), "invalid-proof"),
        (RFC_CLIENT_FINAL.replace(b"p=dHzb", b"p=dHz*"), "invalid-encoding"),
        (RFC_CLIENT_FINAL.split(b",p=")[0] + b",p=AAAA", "invalid-proof"),
        (RFC_CLIENT_FINAL.split(b",p=")[0], "invalid-encoding"),
        (RFC_CLIENT_FINAL + b",x=1", "extensions-not-supported"),
    ],
)
def test_server_refuses_a_bad_client_final(client_final: bytes, server_error: str) -> None:
    client, server = rfc_pair()
    server.receive_client_first(client.first())
    with pytest.raises(ScramError) as refused:
        server.receive_client_final(client_final)
    assert refused.value.server_error == server_error
    assert server.state is ServerState.FAILED


def test_server_accepts_y_flag_from_a_client_that_saw_no_plus_mechanism() -> None:
    server = server_for({"user": make_credentials("pencil", RFC_SALT)})
    bare = b"n=user,r=" + RFC_CLIENT_NONCE
    server_first = server.receive_client_first(b"y,," + bare)
    without_proof = b"c=" + base64.b64encode(b"y,,") + b"," + server_first.split(b",")[0]
    auth = bare + b"," + server_first + b"," + without_proof
    proof = reference_proof("pencil", RFC_SALT, scram.DEFAULT_ITERATIONS, auth)
    server.receive_client_final(without_proof + b",p=" + base64.b64encode(proof))
    assert server.username == "user"


# Inputs the caller gives.


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda: make_credentials("pw", RFC_SALT, 4095), "iterations must be"),
        (lambda: make_credentials("pw", b"short", 4096), "salt must be"),
        (lambda: Credentials(RFC_SALT, 4096, b"k", bytes(32)), "must be 32 bytes"),
        (lambda: ScramClient("", "pw", random_bytes=seeded(1)), "user name is empty"),
        (lambda: ScramClient("a\nb", "pw", random_bytes=seeded(1)), "unprintable character"),
        (lambda: ScramClient("u", "pw\x07", random_bytes=seeded(1)), "prohibited"),
        (lambda: ScramClient("u", "pw", random_bytes=seeded(1), nonce_chars=8), "nonces must"),
        (lambda: ScramClient("u", "pw", random_bytes=lambda n: b"x"), "returned 1 bytes"),
        (lambda: ScramClient("u", "pw", random_bytes=bytes), "no usable bytes"),
        (
            lambda: ScramServer(lambda name: None, random_bytes=seeded(1), mock_secret=b"x"),
            "mock_secret",
        ),
    ],
)
def test_bad_local_inputs_are_refused_clearly(build: Callable[[], object], problem: str) -> None:
    with pytest.raises(ScramError, match=problem):
        build()


def test_scram_error_is_a_value_error() -> None:
    assert issubclass(ScramError, ValueError)


@pytest.mark.parametrize(
    ("raw", "prepared"),
    [
        ("I\u00adX", "IX"),  # RFC 4013 section 3 examples
        ("user", "user"),
        ("USER", "USER"),
        ("\u00aa", "a"),
        ("\u2168", "IX"),
        ("a\u00a0b", "a b"),  # non-ASCII space maps to space
    ],
)
def test_saslprep_follows_rfc4013_examples(raw: str, prepared: str) -> None:
    assert saslprep(raw) == prepared


@pytest.mark.parametrize("raw", ["\u0007", "\u0627\u0031", "\ud800", "\U000e0001", "\u00ad", ""])
def test_saslprep_refuses_prohibited_and_mixed_direction_text(raw: str) -> None:
    with pytest.raises(ScramError):
        saslprep(raw)


def test_saslname_escaping_matches_rfc5802() -> None:
    assert escape_username("a,b=c") == "a=2Cb=3Dc"
    assert escape_username("=2C") == "=3D2C"
    assert unescape_username("=3D2C") == "=2C"


def test_names_with_separators_log_in_escaped() -> None:
    name = "a,b=c"
    client = ScramClient(name, "pw", random_bytes=seeded(7))
    first = client.first()
    assert first.startswith(b"n,,n=a=2Cb=3Dc,r=")
    server = server_for({name: make_credentials("pw", scram.new_salt(seeded(8)))})
    proof = client.receive_server_first(server.receive_client_first(first))
    client.receive_server_final(server.receive_client_final(proof))
    assert server.username == name


# Properties.

NAMES = st.text(
    alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "S")) | st.sampled_from(", ="),
    min_size=1,
    max_size=40,
)
PRINTABLE_ASCII = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
#: Passwords SASLprep accepts (unless one is only the soft hyphen, which maps to nothing).
GOOD_PASSWORDS = st.text(
    alphabet=PRINTABLE_ASCII | st.sampled_from("é߀中\u00a0\u00ad\u2168"), min_size=1, max_size=30
)
#: Some with characters SASLprep refuses (controls, mixed right-to-left).
PASSWORDS = st.text(
    alphabet=PRINTABLE_ASCII | st.sampled_from("é߀中\u00a0\u00ad\u0007\u0627"),
    min_size=1,
    max_size=30,
)


@given(name=NAMES)
def test_escaping_round_trips_and_leaves_no_bare_separators(name: str) -> None:
    escaped = escape_username(name)
    assert "," not in escaped
    assert unescape_username(escaped) == name


@settings(max_examples=40, deadline=None)
@given(username=NAMES, password=PASSWORDS, seed=st.integers(0, 2**32))
def test_login_round_trips_for_any_name_and_password(
    username: str, password: str, seed: int
) -> None:
    assume(len(username.encode()) <= scram.MAX_USERNAME_BYTES)
    try:
        prepared = saslprep(password)
    except ScramError:
        # The client refuses the same password at construction: nothing is sent.
        with pytest.raises(ScramError):
            ScramClient(username, password, random_bytes=seeded(seed))
        return
    credentials = make_credentials(password, scram.new_salt(seeded(seed)))
    server = server_for({username: credentials}, seed + 1)
    client = ScramClient(username, password, random_bytes=seeded(seed))
    login(client, server)
    assert server.username == username
    assert client.state is ClientState.DONE
    # The proof is the one RFC 5802 defines, computed independently.
    assert (
        credentials.stored_key
        == hashlib.sha256(
            hmac.new(
                hashlib.pbkdf2_hmac("sha256", prepared.encode(), credentials.salt, 4096),
                b"Client Key",
                hashlib.sha256,
            ).digest()
        ).digest()
    )


@settings(max_examples=25, deadline=None)
@given(username=NAMES, password=GOOD_PASSWORDS, other=GOOD_PASSWORDS, seed=st.integers(0, 2**32))
def test_any_other_password_is_refused(username: str, password: str, other: str, seed: int) -> None:
    assume(len(username.encode()) <= scram.MAX_USERNAME_BYTES)
    try:
        assume(saslprep(password) != saslprep(other))
    except ScramError:
        assume(False)
    credentials = make_credentials(password, scram.new_salt(seeded(seed)))
    refused = refusal(
        ScramClient(username, other, random_bytes=seeded(seed)),
        server_for({username: credentials}, seed + 1),
    )
    assert refused.server_error == "invalid-proof"


@settings(max_examples=200, deadline=None)
@given(message=st.binary(max_size=300), final=st.booleans())
def test_server_raises_only_scram_errors_on_arbitrary_bytes(message: bytes, final: bool) -> None:
    client, server = rfc_pair()
    if final:
        server.receive_client_first(client.first())
    try:
        (server.receive_client_final if final else server.receive_client_first)(message)
    except ScramError:
        assert server.state is ServerState.FAILED
