"""Secrets by reference: ``api_key_file`` and ``weights.token_file`` / ``weights.token_env`` name
where a secret is on the control machine, so an inventory in git holds none. They are read at
deploy time (by the operations), never when the inventory loads, and never quoted back."""

from __future__ import annotations

import pytest

from operations import serving
from operations.status import host_status
from operations.weights import control_token, read_control_token
from specfleet.core.errors import SettingsError, SpecfleetError
from specfleet.core.plan import GPUS, TOPOLOGY, make_plan
from specfleet.core.settings import settings_from_dict
from tests.unit.test_server_render import _facts

REV = "0123456789abcdef0123456789abcdef01234567"
KEY = "sk-by-reference-0123456789"


def _settings(**over):
    data = {
        "target": {"repo_id": "tests/tiny-target", "revision": REV},
        "drafter": {"repo_id": "z-lab/Kimi-K2.6-DFlash", "revision": REV},
    }
    data.update(over)
    return settings_from_dict(data, host="h1")


# --------------------------------------------------------------------------------------------------
# api_key_file
# --------------------------------------------------------------------------------------------------


def test_api_key_file_is_not_read_when_the_inventory_loads(tmp_path):
    missing = tmp_path / "not-yet" / "api-key"
    s = _settings(api_key_file=str(missing))  # loads: the file is read at deploy time
    assert s.api_key is None and s.api_key_file == str(missing)
    assert serving.has_api_key(s)
    with pytest.raises(SpecfleetError) as err:
        serving.api_key(s)
    assert err.value.problem.startswith(f"api_key_file {missing} cannot be read on the control")
    assert "api_key_file" in err.value.fix


def test_api_key_file_is_read_at_deploy_time_and_renders_as_api_key_does(tmp_path):
    path = tmp_path / "api-key"
    path.write_text(KEY + "\n")
    by_file, inline = _settings(api_key_file=str(path)), _settings(api_key=KEY)
    assert serving.api_key(by_file) == KEY == serving.api_key(inline)
    assert serving.api_key(_settings()) is None and not serving.has_api_key(_settings())
    assert KEY not in repr(by_file) and KEY not in repr(inline)
    plan = make_plan(_facts(), by_file, {"block_size": 8})
    ctx = serving.unit_context(plan.argv, plan.env, by_file, serving.build_info(by_file, None))
    ctx_inline = serving.unit_context(plan.argv, plan.env, inline, serving.build_info(inline, None))
    # The same unit, env file and secret path as with api_key; the key is in none of them.
    assert ctx == ctx_inline
    unit = serving.render(serving.UNIT_TEMPLATE, ctx)
    assert "--config /etc/specfleet/secrets/specfleet-sglang.yaml" in unit
    assert KEY not in unit and KEY not in serving.render(serving.ENV_TEMPLATE, ctx)
    assert serving.secret_yaml(serving.api_key(by_file)) == serving.secret_yaml(KEY)


@pytest.mark.parametrize(
    "content, problem",
    [
        ("", "is empty"),
        ("  \n", "is empty"),
        (KEY + "\nsecond line\n", "holds more than one line"),
        ("sk-\x07bell", "a space, or a character that is not printable ASCII"),
        ("sk-with a space", "a space, or a character that is not printable ASCII"),
        (b"\xff\xfe", "is not UTF-8 text"),
    ],
)
def test_a_bad_api_key_file_is_a_clear_error_that_never_quotes_the_key(tmp_path, content, problem):
    path = tmp_path / "api-key"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(SpecfleetError) as err:
        serving.read_api_key_file(str(path))
    text = err.value.render()
    assert problem in text and "\n  fix: " in text
    assert "second line" not in text and "bell" not in text


def test_status_compares_the_secret_read_from_api_key_file(tmp_path):
    path = tmp_path / "api-key"
    path.write_text(KEY)
    s = _settings(api_key_file=str(path))
    facts = {**_facts(), serving.DRAFTER_CONFIG: {"block_size": 8}}
    current = serving.plan_from_facts(s, facts, "h1")
    # Every one of the server's files as the deploy writes it (the key: from the file).
    paths = serving.server_paths(s)
    files = {paths.files()[k]: text for k, text in serving.server_texts(s, current).items()}
    assert files[paths.secret] == serving.secret_yaml(KEY)
    service = {"files": {p: {"sha1": serving.sha1_text(t)} for p, t in files.items()},
               "active_state": "active"}  # fmt: skip
    st = host_status(s, {**facts, serving.SERVICE: service}, "h1")
    assert not any("differ" in d for d in st.drift), st.drift
    path.write_text(KEY + "-rotated")
    st = host_status(s, {**facts, serving.SERVICE: service}, "h1")
    assert "api key differs: the next deploy would restart the server" in st.drift
    path.unlink()
    st = host_status(s, {**facts, serving.SERVICE: service}, "h1")
    assert any(d.startswith("no plan: api_key_file") for d in st.drift), st.drift


def test_api_key_and_api_key_file_together_are_refused():
    with pytest.raises(SettingsError) as err:
        _settings(api_key=KEY, api_key_file="/etc/specfleet/api-key")
    text = str(err.value)
    assert "settings keys 'api_key' and 'api_key_file' are both set" in text
    assert KEY not in text


# --------------------------------------------------------------------------------------------------
# The Hugging Face token: weights.token_file, weights.token_env, HF_TOKEN
# --------------------------------------------------------------------------------------------------


def test_token_env_names_the_variable_that_holds_the_token(tmp_path):
    env = {"HF_TOKEN": "hf_default", "HF_TOKEN_PROD": " hf_prod \n"}
    assert read_control_token(None, env, token_env="HF_TOKEN_PROD") == "hf_prod"
    # Without token_env: HF_TOKEN, as before.
    assert read_control_token(None, env) == "hf_default"
    s = _settings(weights={"token_env": "HF_TOKEN_PROD"})
    assert control_token(s.weights, env) == "hf_prod"
    assert control_token(_settings().weights, env) == "hf_default"
    assert control_token(_settings().weights, {}) is None
    f = tmp_path / "tok"
    f.write_text("hf_file\n")
    assert control_token(_settings(weights={"token_file": str(f)}).weights, env) == "hf_file"


@pytest.mark.parametrize("environ", [{}, {"HF_TOKEN_PROD": ""}, {"HF_TOKEN": "hf_default"}])
def test_a_named_token_variable_that_is_unset_is_an_error_not_no_token(environ):
    with pytest.raises(SpecfleetError) as err:
        read_control_token(None, environ, token_env="HF_TOKEN_PROD")
    assert err.value.problem == (
        "weights.token_env names HF_TOKEN_PROD, which is not set (or empty) in the control "
        "machine's environment"
    )
    assert "export HF_TOKEN_PROD" in err.value.fix


@pytest.mark.parametrize(
    ("weights", "environ", "shown"),
    [
        ({}, {"HF_TOKEN": "hf_x"}, "$HF_TOKEN on the control machine: set"),
        ({}, {"HF_TOKEN": " \n"}, "$HF_TOKEN on the control machine: unset, so only"),
        ({}, {}, "$HF_TOKEN on the control machine: unset, so only"),
        ({"token_env": "HF_P"}, {"HF_P": "hf_p", "HF_TOKEN": ""}, "$HF_P on the control machine: set"),
        ({"token_env": "HF_P"}, {"HF_TOKEN": "hf_x"}, "$HF_P on the control machine: unset (a deploy"),
        ({"token_file": "TOKFILE"}, {"HF_TOKEN": "hf_x"}, "file TOKFILE on the control machine"),
    ],
)
def test_specfleet_settings_says_the_token_source_a_deploy_reads(tmp_path, weights, environ, shown):
    """``specfleet settings`` and the deploy follow one rule (``control_token_source``): what the
    view calls set is what the deploy reads, unset-and-named is what stops it, a file is read."""
    from specfleet.fleet.inventory_view import secret_references

    tok = tmp_path / "tok"
    tok.write_text("hf_file\n")
    weights = {k: (str(tok) if v == "TOKFILE" else v) for k, v in weights.items()}
    w = _settings(weights=weights).weights
    said = secret_references(_settings(weights=weights), environ)["hf_token"]
    assert said.startswith(shown.replace("TOKFILE", str(tok))), said
    if said.endswith(": set") or said.startswith("file "):
        assert control_token(w, environ) in {"hf_x", "hf_p", "hf_file"}
    elif "a deploy stops" in said:
        with pytest.raises(SpecfleetError, match="not set"):
            control_token(w, environ)
    else:
        assert control_token(w, environ) is None


def test_token_file_that_is_not_text_is_an_error(tmp_path):
    f = tmp_path / "tok"
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(SpecfleetError, match="is not UTF-8 text"):
        read_control_token(str(f), {})


def test_token_settings_hold_no_token_and_load_without_reading_anything(tmp_path):
    s = _settings(weights={"token_file": str(tmp_path / "absent"), "token_env": None})
    assert s.weights.token_file.endswith("absent")
    s = _settings(weights={"token_env": "HF_TOKEN"})
    assert s.weights.token_env == "HF_TOKEN"
    with pytest.raises(SettingsError, match="'weights.token_file' and 'weights.token_env' are"):
        _settings(weights={"token_file": "~/.cache/huggingface/token", "token_env": "HF_TOKEN"})


def test_the_launch_plan_never_carries_a_secret_given_by_reference(tmp_path, monkeypatch):
    path = tmp_path / "api-key"
    path.write_text(KEY)
    monkeypatch.setenv("HF_TOKEN_PROD", "hf_secret_token")
    s = _settings(api_key_file=str(path), weights={"token_env": "HF_TOKEN_PROD"})
    plan = make_plan({GPUS: _facts()[GPUS], TOPOLOGY: _facts()[TOPOLOGY]}, s, None, predicted=True)
    assert KEY not in plan.to_json() and "hf_secret_token" not in plan.to_json()
