"""No secret in the journal: the server's logging config, its redacting formatter, the gate's excerpt.

SGLang logs its ServerArgs at start, API key included: 0.5.11 and 0.5.14 as the dataclass repr
(``server_args=ServerArgs(..., api_key='...', admin_api_key=None, ...)``, engine.py ~L679 / ~L784),
0.5.23 as a dict (``server_args={..., 'api_key': '...', ...}``, ~L1185). Its supported way to shape
its logging is ``SGLANG_LOGGING_CONFIG_PATH``, a JSON ``logging.config.dictConfig`` that
``configure_logger`` applies as it is (0.5.11 srt/utils/common.py ~L1207). specfleet writes one
whose formatter (``specfleet/hostside/specfleet_log_redact.py``, on the server's PYTHONPATH)
redacts API keys; the stand-in server (tests/harness/standin_sglang_server.py) logs the way SGLang
does, so it runs here end to end.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from operations import serving
from specfleet.core.errors import SettingsError
from specfleet.core.plan import make_plan
from tests.unit.test_redaction import server_forms
from tests.unit.test_server_render import _facts, _settings

STANDIN = Path(__file__).parents[1] / "harness" / "standin_sglang_server.py"

# Keys a user may hold: both quote kinds (Python's repr then escapes the quote), a backslash (doubled
# by repr and JSON), regex characters. Each part marked XK so that any leak of a piece shows.
KEYS = [
    "sk-XK1'XK2\"XK3",
    "sk-XK1'XK2",
    'sk-XK1"XK2',
    "sk-XK1\\XK2'\"XK3\\",
    "sk-XK1.*+?[(|$^{}XK2)]",
    "XK1 XK2",
]
# Those the settings accept (a key with a space is refused: tests/unit/test_redaction.py).
SETTABLE_KEYS = [k for k in KEYS if " " not in k]


def lines_for(key: str) -> list[str]:
    """Every shape in which SGLang, a shell or a YAML file shows an API key."""
    return [*server_forms(key), f"api-key: {json.dumps(key)}", f"admin_api_key={key!r}"]


def _gate():
    spec = importlib.util.spec_from_file_location("readiness_gate", serving.GATE_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _redactor():
    spec = importlib.util.spec_from_file_location("specfleet_log_redact", serving.LOG_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("key", KEYS)
def test_the_gate_excerpt_redacts_keys_with_quotes_and_regex_characters(key):
    # The shapes alone, with no key known (a journal line of a key the gate cannot read)...
    for line in lines_for(key):
        out = _gate().redact(line, None)
        assert "XK" not in out and "<redacted>" in out, (line, out)
    # ...and with the key known.
    for line in [*lines_for(key), f"Authorization: Bearer {key}", f"repr {key!r} json {json.dumps(key)}"]:
        out = _gate().redact(line, key)
        assert "XK" not in out and "<redacted>" in out, (line, out)


def test_the_gate_keeps_what_is_not_a_key():
    gate = _gate()
    for line in ("server_args=ServerArgs(model_path='/m', api_key=None, admin_api_key=None)",
                 "{'api_key': None}", '{"api_key": null}', "the api_key is missing",
                 "nothing secret here"):  # fmt: skip
        assert gate.redact(line, None) == line


def _shipped_gate() -> dict:
    """The gate as a host runs it (``python3 -`` with ``serving.gate_source()`` on stdin), its
    names once its definitions ran."""
    space: dict = {"__name__": "shipped_gate"}
    exec(compile(serving.gate_source(), "<stdin>", "exec"), space)  # noqa: S102 - our own source
    return space


def test_the_gate_has_no_redaction_rules_of_its_own():
    """One home for the rules: the gate file defines none; as shipped, the redaction module's
    source runs ahead of it in the same script and is what it calls."""
    text = serving.GATE_SCRIPT.read_text()
    assert "re.compile" not in text and "SECRET_PATTERNS" not in text and "def redact" not in text
    source = serving.gate_source()
    assert source.count("SECRET_PATTERNS = ") == 1 and source.count("def redact(") == 1
    space = _shipped_gate()
    assert space["__doc__"].startswith("specfleet readiness gate")
    assert space["journal_tail"].__globals__["redact_lines"] is space["redact_lines"]
    assert space["SECRET_PATTERNS"][0].pattern == _redactor().SECRET_PATTERNS[0].pattern


@pytest.mark.parametrize("key", KEYS)
def test_the_server_formatter_redacts_as_the_shipped_gate_does(key):
    redactor = _redactor()
    gate = _shipped_gate()
    for line in [*lines_for(key), "no key here", f"Bearer {key}"]:
        assert redactor.redact(line, [key]) == gate["redact"](line, [key]), line
        assert redactor.redact(line, []) == gate["redact"](line, []), line


def _configure(tmp_path, key: str | None, log_level: str | None = None) -> tuple[Path, dict]:
    """The logging config specfleet writes for a server with ``key``, its paths moved under
    ``tmp_path``; returns the config's path and the env the unit gives the server."""
    over = {"api_key": key} if key else {}
    if log_level:
        over["plan"] = {"extra_args": {"--log-level": log_level}}
    s = _settings(**over)
    plan = make_plan(_facts(), s, {"block_size": 8})
    paths = serving.server_paths(s)
    config = json.loads(serving.logging_config(s, plan.argv))
    secret = tmp_path / "secret.yaml"
    if key:
        secret.write_text(serving.secret_yaml(key))
    assert config["formatters"]["sglang"]["secret_files"] == [paths.secret]
    config["formatters"]["sglang"]["secret_files"] = [str(secret)]
    folder = tmp_path / "logging"
    folder.mkdir()
    (folder / "logging.json").write_text(json.dumps(config))
    (folder / "specfleet_log_redact.py").write_text(serving.LOG_MODULE.read_text())
    env = serving.server_env(plan.env, s)
    assert env["SGLANG_LOGGING_CONFIG_PATH"] == paths.log_config
    assert env["PYTHONPATH"] == paths.log_dir
    return folder / "logging.json", {"SGLANG_LOGGING_CONFIG_PATH": str(folder / "logging.json"),
                                     "PYTHONPATH": str(folder)}


def _standin(env: dict, key: str, *extra: str) -> str:
    argv = [sys.executable, str(STANDIN), "--model-path", "/srv/m", "--api-key", key,
            "--standin-exit", "0", *extra]
    proc = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


@pytest.mark.local
@pytest.mark.parametrize("key", SETTABLE_KEYS)
def test_the_server_logs_its_args_with_the_key_redacted(tmp_path, key):
    _, env = _configure(tmp_path, key)
    out = _standin(env, key)
    assert "XK" not in out, out
    line = next(ln for ln in out.splitlines() if "server_args=" in ln)
    # SGLang's own format, the line still there, only the key gone.
    assert line.startswith("[20") and "] server_args=ServerArgs(model_path='/srv/m', " in line
    assert "api_key='<redacted>'" in line or 'api_key="<redacted>"' in line, line
    # Without the config, the stand-in (as SGLang) logs the key: the test would see a leak.
    assert "XK1" in _standin({}, key)


@pytest.mark.local
def test_the_config_keeps_sglangs_loggers_level_and_format(tmp_path):
    config_path, env = _configure(tmp_path, None, log_level="warning")
    config = json.loads(config_path.read_text())
    # SGLang's module loggers exist before configure_logger runs: they must stay enabled.
    assert config["disable_existing_loggers"] is False
    assert config["root"]["level"] == "WARNING"  # the server's --log-level
    assert config["loggers"] == {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}}
    # At warning, the stand-in's info line is not logged at all, as with SGLang's basicConfig.
    assert "server_args" not in _standin(env, "sk-XK1", "--log-level", "warning")


def test_the_formatter_keeps_the_schedulers_prefix(monkeypatch):
    # SGLang's scheduler sets its process title, then configure_logger(prefix=" DP0 TP3"): a dict
    # config cannot know the prefix, the formatter reads it back from the title.
    class Title:
        @staticmethod
        def getproctitle():
            return "sglang::scheduler_DP0_ATTN_CP1_TP3"

    monkeypatch.setitem(sys.modules, "setproctitle", Title)
    monkeypatch.delenv("SGLANG_LOG_MS", raising=False)
    fmt = _redactor().RedactingFormatter()
    record = logging.LogRecord("sglang.srt.managers.scheduler", logging.INFO, "x", 1,
                               "api_key=%r", ("sk-XK1",), None)  # fmt: skip
    out = fmt.format(record)
    assert out.endswith(" DP0 ATTN_CP1 TP3] api_key='<redacted>'"), out
    monkeypatch.setitem(sys.modules, "setproctitle", None)
    monkeypatch.setenv("SGLANG_LOG_MS", "1")
    assert _redactor().RedactingFormatter()._fmt == "[%(asctime)s.%(msecs)03d] %(message)s"


def test_the_server_env_points_at_the_config_and_keeps_the_plans_pythonpath():
    # The settings refuse PYTHONPATH and SGLANG_LOGGING_CONFIG_PATH in plan.extra_env (they would
    # take the redacting config away); a plan's env that has one still gets the config first.
    for name in ("PYTHONPATH", "SGLANG_LOGGING_CONFIG_PATH"):
        with pytest.raises(SettingsError, match=f"plan.extra_env.{name}"):
            _settings(plan={"extra_env": {name: "/opt/mine"}})
    s = _settings()
    paths = serving.server_paths(s)
    env = serving.server_env({"PYTHONPATH": "/opt/mine"}, s)
    assert env["PYTHONPATH"] == f"{paths.log_dir}:/opt/mine"
    assert env["SGLANG_LOGGING_CONFIG_PATH"] == paths.log_config
    assert paths.log_dir == "/etc/specfleet/specfleet-sglang.logging"
    assert paths.log_config.startswith(paths.log_dir + "/")
    assert paths.log_module == paths.log_dir + "/specfleet_log_redact.py"
    assert paths.log_config in paths.unit_files()
    assert paths.log_module in paths.unit_files()
