"""The one redaction module (specfleet/hostside/specfleet_log_redact.py), as properties: whatever
the key holds (quotes, backslashes, regex metacharacters), in every form a log shows it in, and in
a record split over two journal lines, the key is found nowhere in what comes out.

Forms: SGLang's ServerArgs (dataclass repr, dict repr), JSON, an argv as repr, JSON and shell
line, ``--api-key=``, ``--api_key K``, ``{"--api-key": K}``, YAML ``api-key:``, prefixed env names
(``SGLANG_API_KEY=``, ``OPENAI_API_KEY=``), ``apiKey``, ``x-api-key:``, ``Authorization: Bearer``,
JSON inside JSON, a repr of a repr, a bare ``--api-key None-...``.
"""

from __future__ import annotations

import json
import shlex
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfleet.core.errors import SettingsError
from specfleet.core.settings import settings_from_dict
from specfleet.hostside import specfleet_log_redact as R

# Printable ASCII without whitespace: what the settings accept as a key.
KEY_CHARS = "".join(c for c in string.printable if c not in string.whitespace)
# Characters that once broke redaction: quotes, backslashes, regex and shell metacharacters.
HOSTILE = "'\"\\.*+?[](){}|$^,;:=-"


def server_forms(key: str) -> list[str]:
    """The lines in which SGLang (its ServerArgs, its argv) and a shell show ``key``."""
    argv = ["python3", "-m", "sglang.launch_server", "--api-key", key, "--port", "1"]
    return [
        f"server_args=ServerArgs(model_path='/m', api_key={key!r}, admin_api_key=None, port=1)",
        f"server_args={{'model_path': '/m', 'api_key': {key!r}, 'admin_api_key': {key!r}}}",
        json.dumps({"api_key": key, "port": 1}),
        f"argv: {argv!r}",
        f"argv: {json.dumps(argv)}",
        f"cmd: {shlex.join(argv)}",
        f"cmd: --api-key={shlex.quote(key)} --port 1",
    ]


def forms(key: str) -> list[str]:
    """Every line in which a log shows ``key``."""
    inner = json.dumps({"api_key": key, "port": 1})
    return [
        *server_forms(key),
        f"cmd: --api_key {shlex.quote(key)} --port 1",
        json.dumps({"--api-key": key, "--port": 1}),
        f"api-key: {json.dumps(key)}",
        f"Environment=SGLANG_API_KEY={shlex.quote(key)} OPENAI_API_KEY={shlex.quote(key)}",
        f"SGLANG_API_KEY={key} OPENAI_API_KEY={key}",
        json.dumps({"apiKey": key}),
        f"x-api-key: {key}",
        f"Authorization: Bearer {key}",
        json.dumps({"message": inner}),  # JSON inside JSON
        json.dumps({"log": json.dumps({"message": inner})}),  # and once more
        f"args={repr(f'api_key={key!r}')}",  # a repr of a repr
        f"--api-key None-{key}",
        *unnamed(key),
    ]


def unnamed(key: str) -> list[str]:
    """Lines that show ``key`` under no name a pattern knows: only the configured key finds it."""
    return [
        f"the key {key} leaked",
        json.dumps({"message": json.dumps({"note": key})}),  # escaped twice
        f"note={repr(repr(key))}",
    ]


def no_key(out: str) -> None:
    # Every key is marked XK1, XK2, XK3 between its hostile parts (no form's text holds "XK"):
    # no piece of it, in whatever escaping, comes out.
    assert "XK" not in out, out


def marked(parts: st.SearchStrategy) -> st.SearchStrategy:
    return st.builds(lambda a, b, c: f"sk-XK1{a}XK2{b}XK3{c}", parts, parts, parts)


keys = marked(st.text(alphabet=st.sampled_from(KEY_CHARS + HOSTILE * 3), max_size=8))
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(key=keys)
def test_a_configured_key_is_found_nowhere_in_any_form(key):
    for line in forms(key):
        no_key(R.redact(line, [key]))


@FAST
@given(key=keys, data=st.data())
def test_a_configured_key_split_over_two_journal_lines_is_found_nowhere(key, data):
    """A record that reaches the journal as two lines (journald's line limit, a newline inside a
    value), with or without the journal's prefix on the second (``-o short-iso``/``-o cat``)."""
    line = data.draw(st.sampled_from(forms(key)))
    at = data.draw(st.integers(min_value=1, max_value=len(line) - 1))
    prefix = data.draw(st.sampled_from(["", "2026-12-02T03:00:00+0000 h1 python3[42]: "]))
    lines = ["before", line[:at], prefix + line[at:], "after"]
    out = R.redact_lines(lines, [key])
    assert len(out) == 4 and out[0] == "before" and out[3] == "after", out
    no_key("\n".join(out))


# A key nobody configured (a journal line of another server, a key file the reader cannot
# read): the patterns alone must find it in every form that names it.
token_keys = marked(st.text(alphabet=string.ascii_letters + string.digits + "._~+/=-",
                            max_size=8))


@FAST
@given(key=token_keys)
def test_an_unknown_key_is_found_nowhere_in_a_form_that_names_it(key):
    for line in forms(key)[: -len(unnamed(key))]:
        no_key(R.redact(line, []))


def test_a_flag_at_the_end_of_a_line_takes_its_value_from_the_next():
    out = R.redact_lines(["launch --api-key", "sk-XK1 --port 1"], [])
    assert out == ["launch --api-key", "<redacted> --port 1"]


def test_what_is_not_a_key_stays():
    for line in ("server_args=ServerArgs(model_path='/m', api_key=None, admin_api_key=None)",
                 "{'api_key': None}", '{"api_key": null}', "the api_key is missing",
                 "Authorization header missing", "nothing secret here"):  # fmt: skip
        assert R.redact(line, []) == line
        assert R.redact(line, ["sk-XK1XK2"]) == line


@given(key=st.builds(lambda a, bad, b: f"sk-XK{a}{bad}{b}", st.text(max_size=8),
                     st.sampled_from(" \t\n\r\x0b\x0c\x00\x1b\x7f\u00a0\u2028"),
                     st.text(max_size=8)))  # fmt: skip
@FAST
def test_a_key_with_whitespace_or_a_control_character_is_refused(key):
    with pytest.raises(SettingsError, match="api_key") as raised:
        settings_from_dict({"api_key": key}, host="h1")
    said = str(raised.value)
    assert "h1" in said and "without spaces" in said
    assert "XK" not in said  # a secret is never quoted back


@pytest.mark.parametrize("key", ['sk XK1 "XK2"', "sk-'XK1' XK2", "XK1\tXK2"])
def test_a_key_with_spaces_and_quotes_is_refused_and_still_redacted_where_known(key):
    with pytest.raises(SettingsError):
        settings_from_dict({"api_key": key}, host="h1")
    # A key that reached a host before this rule (an older deploy's key file) is still known to
    # the exact pass, in every form.
    for line in forms(key):
        out = R.redact(line, [key])
        assert "XK1" not in out and "XK2" not in out, (line, out)
        # Split over two journal lines anywhere; journald drops the first's trailing whitespace.
        for at in range(1, len(line)):
            out = "\n".join(R.redact_lines([line[:at].rstrip(), line[at:]], [key]))
            assert "XK1" not in out and "XK2" not in out, (line, at, out)
