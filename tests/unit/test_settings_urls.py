"""URL settings mean one host, whatever the client: every URL the settings accept is read as the
same host and port by urllib.parse (our check), urllib3 (requests, huggingface_hub < 1.0) and
httpx (huggingface_hub >= 1.0); the forms where they disagree are refused."""

from __future__ import annotations

import urllib.parse

import httpx
import pytest
import urllib3.util
from hypothesis import given, settings
from hypothesis import strategies as st

from specfleet.core.settings import SettingsError, settings_from_dict
from specfleet.core.settings.validators import url_problem


def hosts_seen(url: str) -> dict[str, tuple[str | None, int | None]]:
    """(host, port) as each client's parser reads ``url``; an error where one refuses it."""
    seen: dict[str, tuple[str | None, int | None]] = {}
    parts = urllib.parse.urlsplit(url)
    seen["urllib.parse"] = (parts.hostname, parts.port)
    u3 = urllib3.util.parse_url(url)
    seen["urllib3"] = ((u3.host or "").strip("[]").lower() or None, u3.port)
    hx = httpx.URL(url)
    seen["httpx"] = (hx.host.lower() or None, hx.port)
    return seen


def test_the_reported_bypass_is_read_as_two_hosts_and_refused():
    url = "http://evil.example\\@127.0.0.1/"
    # The reason: urlsplit says loopback, urllib3 would connect to evil.example.
    assert urllib.parse.urlsplit(url).hostname == "127.0.0.1"
    assert urllib3.util.parse_url(url).host == "evil.example"
    with pytest.raises(SettingsError, match="without backslashes"):
        settings_from_dict({"weights": {"hf_endpoint": url}}, host="h")


HOSTILE = [
    "http://evil.example\\@127.0.0.1/",
    "http://evil.example\\\\@localhost:8080/",
    "http://127.0.0.1\\.evil.example/",
    "http://evil.example%40127.0.0.1/",
    "http://127.0.0.1%2f@evil.example/",
    "http://127.0.0.1%00.evil.example/",
    "http://user@127.0.0.1/",
    "http://evil.example:80@127.0.0.1/",
    "http://127.0.0.1:80@evil.example/",
    "https://hf.co@evil.example/",
    "http://[::1]@evil.example/",
    "http://127.1/",
    "http://0x7f.1/",
    "http://2130706433/",
    "http://-oProxyCommand=id/",
    "http://127.0.0.1 .evil.example/",
    "http://127.0.0.1\t/",
    "http://[::1]0/",
    "http://127.0.0.1:/",
]


@pytest.mark.parametrize("url", HOSTILE)
def test_urls_clients_may_read_as_another_host_are_refused(url):
    assert url_problem(url) is not None
    with pytest.raises(SettingsError) as err:
        settings_from_dict({"weights": {"hf_endpoint": url}}, host="h")
    assert "weights.hf_endpoint" in str(err.value) and "fix:" in str(err.value)


GOOD = ["https://huggingface.co", "https://hf-mirror.com/", "http://127.0.0.1:8080",
        "http://[::1]:9000/hub", "http://localhost:9000/hub?x=1", "https://10.0.0.5:8443/a/b"]


@pytest.mark.parametrize("url", GOOD)
def test_good_urls_are_read_alike_by_every_client(url):
    assert url_problem(url) is None
    assert len(set(hosts_seen(url).values())) == 1, hosts_seen(url)


# Generated URLs around the characters that parsers read differently.
_piece = st.text(alphabet="ab1.:@\\/%#?[]-_ \t2f0x", min_size=0, max_size=12)


@settings(max_examples=400, deadline=None, database=None)
@given(scheme=st.sampled_from(["http", "https"]), head=_piece,
       host=st.sampled_from(["127.0.0.1", "evil.example", "[::1]", "localhost"]), tail=_piece)
def test_every_accepted_url_is_one_host_for_every_client(scheme, head, host, tail):
    url = f"{scheme}://{head}{host}{tail}"
    if url_problem(url) is not None:
        return
    try:
        seen = hosts_seen(url)
    except (ValueError, urllib3.exceptions.LocationParseError, httpx.InvalidURL) as exc:
        pytest.fail(f"{url!r} is accepted but a client refuses it: {exc!r}")
    assert len(set(seen.values())) == 1, (url, seen)
