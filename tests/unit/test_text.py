"""What a host, a peer or an inventory gives is shown safely (issue 55, lower items): printable
text only, and no token-shaped value, wherever settings are shown or quoted back."""

from __future__ import annotations

import pytest

from specfleet.core.errors import SettingsError
from specfleet.core.settings import settings_from_dict
from specfleet.core.text import TOKEN_MASK, mask_tokens, printable
from specfleet.fleet.inventory_view import settings_view

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345"


def test_printable_replaces_escapes_and_cuts():
    assert printable("held by \x1b[2Jroot\r\x07") == "held by ?[2Jroot??"
    assert printable("x" * 300, 10) == "xxxxxxx..."


def test_token_shapes_are_masked():
    assert mask_tokens(f"path /srv/{HF}/m") == f"path /srv/{TOKEN_MASK}/m"
    for token in ("sk-" + "a" * 40, "ghp_" + "B" * 36, "AKIA" + "ABCDEFGHIJKLMNOP",
                  "glpat-" + "c" * 20):
        assert token not in mask_tokens(f"x={token};"), token
    assert mask_tokens("/srv/models/hf_small sk-short") == "/srv/models/hf_small sk-short"


def test_specfleet_settings_shows_no_token_put_in_extra_env_or_args():
    s = settings_from_dict({"plan": {"extra_env": {"HUB_MIRROR_NOTE": HF},
                                     "extra_args": {"--served-model-name": HF}}})
    shown = repr(settings_view(s, environ={}))
    assert HF not in shown and TOKEN_MASK in shown


def test_a_token_pasted_into_a_path_field_is_not_quoted_back():
    with pytest.raises(SettingsError) as err:
        settings_from_dict({"models_root": HF}, host="h1")
    assert HF not in str(err.value) and "settings key 'models_root'" in str(err.value)


def test_a_lock_holders_name_reaches_the_terminal_printable():
    """A lock file's owner is the host's word: no escape reaches the operator (status, the
    rollout's 'busy (held by ...)')."""
    from specfleet.core.runlock import holder
    from specfleet.fleet.rollout import busy_words

    said = holder({"owner": "eve\x1b]0;pwned\x07@h", "pid": 1, "taken_at": 0})
    assert "\x1b" not in said and "\x07" not in said and said.startswith("eve?]0;pwned?@h")
    why = ["another specfleet run holds this host: eve\x1b[31m@h (pid 1); its lease ..."]
    assert "\x1b" not in busy_words(why)
