"""The server unit's pure parts: systemd quoting, the env file, the rendered unit, the fact parser.

The quoting here is also checked end to end on a fleet host (tests/fleet/test_server_fleet.py): a unit
with these words is started and the stand-in records the argv and env systemd gave it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from facts.serving import FileText, parse_service_state
from operations import serving
from specfleet.core import unit as unit_core
from specfleet.core.plan import GPUS, SGLANG, TOPOLOGY, make_plan
from specfleet.core.settings import settings_from_dict

FIXTURES = Path(__file__).parents[1] / "fixtures"
REV = "0123456789abcdef0123456789abcdef01234567"


def shlex_systemd_split(line: str) -> list[str]:
    """systemd's own word splitting of an ExecStart= value (a reading of extract_first_word with
    EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE, then $$ and %% unescaping), used to read our quoting back.
    The fleet test checks the same against real systemd."""
    line = line.replace("\\\n", " ")
    words: list[str] = []
    i, n = 0, len(line)
    escapes = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            break
        word, quoted = [], False
        while i < n and (quoted or line[i] not in " \t"):
            ch = line[i]
            if ch == '"':
                quoted = not quoted
            elif ch == "\\" and i + 1 < n:
                nxt = line[i + 1]
                if nxt == "x":
                    word.append(chr(int(line[i + 2 : i + 4], 16)))
                    i += 3
                elif nxt == ";" and not quoted:
                    word.append(";")
                    i += 1
                else:
                    word.append(escapes[nxt])
                    i += 1
            else:
                word.append(ch)
            i += 1
        words.append("".join(word).replace("%%", "%").replace("$$", "$"))
    return words


TRICKY = [
    "plain",
    "with space",
    'dq"uote',
    "sq'uote",
    "back\\slash",
    "$HOME",
    "${HOME}",
    "%n%i",
    ";",
    "",
    "tab\there",
    "new\nline",
    "ünïcödé",
    "--flag=value with space",
]


@pytest.mark.parametrize("word", TRICKY)
def test_systemd_quote_reads_back(word):
    quoted = serving.systemd_quote(word)
    assert shlex_systemd_split(quoted) == [word]
    # Every % is doubled and every $ escaped, so neither a specifier nor a variable survives.
    assert re.search(r"(?<!%)%(?!%)", quoted.replace("%%", "")) is None
    assert "$" not in quoted.replace("$$", "")


def test_exec_start_one_flag_per_line_and_reads_back():
    argv = ["/opt/v/bin/python", "-m", "sglang.launch_server", "--model-path", "/srv/m x",
            "--trust-remote-code", "--port", "30000", *TRICKY]
    text = serving.exec_start(argv)
    assert shlex_systemd_split(text) == argv
    lines = text.split("\n")
    assert lines[0] == "/opt/v/bin/python -m sglang.launch_server \\"
    assert lines[1].strip() == '--model-path "/srv/m x" \\'
    assert lines[2].strip() == "--trust-remote-code \\"


def test_exec_start_rejects_relative_executable_and_nul():
    with pytest.raises(ValueError, match="absolute"):
        serving.exec_start(["python3", "-m", "x"])
    with pytest.raises(ValueError, match="NUL"):
        serving.exec_start(["/bin/x", "a\0b"])


@pytest.mark.parametrize(
    "value,line",
    [
        ("1", 'K="1"'),
        ('a "b" $HOME `x` \\ %n', 'K="a \\"b\\" \\$HOME \\`x\\` \\\\ %n"'),
        ("", 'K=""'),
    ],
)
def test_env_line(value, line):
    assert unit_core.env_line("K", value) == line


def test_env_line_rejects_bad_names_and_newlines():
    with pytest.raises(ValueError, match="name"):
        unit_core.env_line("1BAD", "x")
    with pytest.raises(ValueError, match="newline"):
        unit_core.env_line("K", "a\nb")


def test_secret_yaml_is_valid_yaml_and_json_string():
    import yaml
    key = 'k3y-with "quotes" and \\ and: colon #hash'
    text = serving.secret_yaml(key)
    assert yaml.safe_load(text) == {"api-key": key}
    with pytest.raises(ValueError):
        serving.secret_yaml("bad\nkey")


def _facts(sglang: str = "0.5.11", gpu: str = "h200x2") -> dict:
    """Facts from the committed fixtures: the wheel-read SGLang fact and a GPU capture's parse."""
    sg = json.loads((FIXTURES / "sglang" / f"{sglang}.json").read_text())["fact"]
    gpus = {
        "gpus": [
            {"index": i, "name": "NVIDIA H200", "compute_capability": "9.0", "sm": 90,
             "memory_mib": 143771, "driver": "570.86.15", "pci_bus_id": f"0000:{i:02x}:00.0"}
            for i in range(2)
        ],
        "error": None,
    }
    topo = {"gpus": gpus["gpus"], "links": {}, "nvlink_all_pairs": True}
    return {GPUS: gpus, TOPOLOGY: topo, SGLANG: sg}


def _settings(**over):
    data = {
        "target": {"repo_id": "tests/tiny-target", "revision": REV},
        "drafter": {"repo_id": "z-lab/Kimi-K2.6-DFlash", "revision": REV},
    }
    data.update(over)
    return settings_from_dict(data)


def test_unit_renders_plan_argv_env_build_and_caches():
    s = _settings(plan={"extra_env": {"EXTRA": "x y"}})
    facts = _facts()
    plan = make_plan(facts, s, {"block_size": 8})
    build = serving.build_info(s, facts[SGLANG])
    ctx = serving.unit_context(plan.argv, plan.env, s, build)
    unit = serving.render(serving.UNIT_TEMPLATE, ctx)
    env = serving.render(serving.ENV_TEMPLATE, ctx)

    exec_value = unit.split("ExecStart=", 1)[1].split("\nRestart=", 1)[0]
    assert shlex_systemd_split(exec_value) == plan.argv
    for key in ("Type=simple", "Restart=on-failure", "StartLimitBurst=3", "TimeoutStopSec=180",
                "LimitNOFILE=1048576", "EnvironmentFile=/etc/specfleet/specfleet-sglang.env"):
        assert key in unit
    # StartLimit* belong to [Unit]; systemd ignores them in [Service] on current versions.
    unit_section = unit.split("[Service]")[0]
    assert "StartLimitIntervalSec=" in unit_section and "StartLimitBurst=" in unit_section
    assert f"target  tests/tiny-target@{REV}" in unit
    assert "SGLang 0.5.11, patch: none" in unit
    assert "PREDICTED" not in unit

    lines = {ln.split("=", 1)[0]: ln.split("=", 1)[1] for ln in env.splitlines()
             if ln and not ln.startswith("#")}
    for key, value in plan.env.items():
        assert lines[key] == f'"{value}"'
    assert lines["SGLANG_DG_CACHE_DIR"] == '"/srv/models/.cache/deep_gemm"'
    assert lines["TRITON_CACHE_DIR"] == '"/srv/models/.cache/triton"'


def test_a_new_revision_or_version_changes_the_unit():
    s = _settings()
    facts = _facts()
    plan = make_plan(facts, s, {"block_size": 8})

    def unit_for(settings, install):
        ctx = serving.unit_context(plan.argv, plan.env, settings, serving.build_info(settings, install))
        return serving.render(serving.UNIT_TEMPLATE, ctx)

    base = unit_for(s, facts[SGLANG])
    other_rev = _settings(target={"repo_id": "tests/tiny-target", "revision": "f" * 40})
    assert unit_for(other_rev, facts[SGLANG]) != base
    built_in = dict(facts[SGLANG], features=dict(facts[SGLANG]["features"], dflash_pr20547=True))
    assert "patch: pr20547 (built in)" in unit_for(s, built_in)
    assert unit_for(s, dict(facts[SGLANG], version="0.5.14")) != base
    assert unit_for(s, facts[SGLANG]) == base  # and rendering is deterministic


def test_api_key_is_in_no_unit_or_env_only_the_config_path():
    key = "sk-very-secret-0123"
    s = _settings(api_key=key)
    plan = make_plan(_facts(), s, {"block_size": 8})
    ctx = serving.unit_context(plan.argv, plan.env, s, serving.build_info(s, None))
    unit = serving.render(serving.UNIT_TEMPLATE, ctx)
    env = serving.render(serving.ENV_TEMPLATE, ctx)
    assert key not in unit and key not in env and key not in json.dumps(ctx)
    words = shlex_systemd_split(unit.split("ExecStart=", 1)[1].split("\nRestart=", 1)[0])
    assert words[-2:] == ["--config", "/etc/specfleet/secrets/specfleet-sglang.yaml"]
    assert words[:-2] == plan.argv


def test_predicted_plan_is_marked_in_the_unit():
    s = _settings()
    plan = make_plan({GPUS: _facts()[GPUS], TOPOLOGY: _facts()[TOPOLOGY]}, s, None, predicted=True)
    ctx = serving.unit_context(plan.argv, plan.env, s, serving.build_info(s, None), "not installed")
    unit = serving.render(serving.UNIT_TEMPLATE, ctx)
    assert "# PREDICTED: not installed" in unit
    assert "SGLang 0.5.23 (not installed yet)" in unit


def test_parse_service_state():
    out = [
        "LoadState=loaded", "ActiveState=failed", "SubState=failed", "Result=start-limit-hit",
        "UnitFileState=enabled", "NeedDaemonReload=yes", "NRestarts=3", "MainPID=0",
        "##file /etc/systemd/system/x.service", "644 root root",
        "da39a3ee5e6b4b0d3255bfef95601890afd80709  -",
        "##file /etc/specfleet/x.env", "600 root root",
        "adc83b19e793491b1c6ea0fd8b46cd9f32e592fc  -",
        "##restart-pending", "the unit changed", "",
    ]
    st = parse_service_state(out)
    assert st["active_state"] == "failed" and st["result"] == "start-limit-hit"
    assert st["need_daemon_reload"] is True and st["n_restarts"] == 3
    assert st["files"]["/etc/specfleet/x.env"] == {
        "mode": 600, "user": "root", "group": "root",
        "sha1": "adc83b19e793491b1c6ea0fd8b46cd9f32e592fc",
    }
    assert st["restart_pending"] == "the unit changed"
    empty = parse_service_state(["LoadState=not-found", "ActiveState=inactive"])
    assert empty["files"] == {} and empty["restart_pending"] is None


def test_argv_value():
    assert serving.argv_value(["x", "--model-path", "/a", "--model-path=/b"], "--model-path") == "/b"
    assert serving.argv_value(["x"], "--model-path") is None


def test_plan_from_facts_predicts_on_a_fresh_host_and_reads_host_revisions():
    s = _settings(drafter={"repo_id": "z-lab/Kimi-K2.6-DFlash", "revision": "main",
                           "follow_branch": True})
    facts = _facts()
    fresh = serving.plan_from_facts(s, {GPUS: facts[GPUS], TOPOLOGY: facts[TOPOLOGY]})
    assert fresh.predicted_because.startswith("SGLang is not installed in /opt/specfleet/sglang yet")
    assert "the drafter's config.json is not in" in fresh.predicted_because
    assert fresh.build["drafter"] == "z-lab/Kimi-K2.6-DFlash@main"

    facts[serving.DRAFTER_CONFIG] = {"block_size": 8}
    facts["weights_drafter"] = {"current": "a" * 40}
    done = serving.plan_from_facts(s, facts)
    assert done.predicted_because is None
    assert done.build["drafter"] == "z-lab/Kimi-K2.6-DFlash@" + "a" * 40
    assert done.argv == make_plan(facts, s, {"block_size": 8}).argv
    # Only the unpinned drafter's revision is read from the host.
    assert "weights_drafter" in serving.host_specs(s, []) and "weights_target" not in (
        serving.host_specs(s, [])
    )


def _gate_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("readiness_gate", serving.GATE_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "line,expected",
    [
        ("server_args=ServerArgs(model_path='/m', api_key='sk-1', admin_api_key=None)",
         "server_args=ServerArgs(model_path='/m', api_key='<redacted>', admin_api_key=None)"),
        ('{"api_key": "sk-2", "port": 1}', '{"api_key": "<redacted>", "port": 1}'),
        ("argv: --api-key sk-3 --port 1", "argv: --api-key <redacted> --port 1"),
        ('api-key: "sk-4"', 'api-key: "<redacted>"'),
        ("the key sk-LITERAL leaked", "the key <redacted> leaked"),
        ("nothing secret here", "nothing secret here"),
    ],
)
def test_gate_redacts_api_keys_from_journal_lines(line, expected):
    assert _gate_module().redact(line, "sk-LITERAL") == expected


def test_gate_reads_the_key_file_specfleet_writes(tmp_path):
    key = 'sk-"odd"\\key'
    path = tmp_path / "k.yaml"
    path.write_text(serving.secret_yaml(key))
    assert _gate_module().read_api_key(str(path)) == key


def test_first_json_parses_or_names_the_bad_file():
    from facts.serving import parse_first_json

    assert parse_first_json([]) is None
    assert parse_first_json(["##path /m/config.json", '{"block_size":', " 8}"]) == {"block_size": 8}
    with pytest.raises(ValueError, match="/m/config.json is not valid JSON"):
        parse_first_json(["##path /m/config.json", "<html>oops"])


def test_an_applied_patch_is_in_the_build_info_and_a_new_one_changes_it():
    s = _settings()
    facts = _facts()
    facts[serving.DRAFTER_CONFIG] = {"block_size": 8}
    assert serving.plan_from_facts(s, facts).build["patch"] == "none"
    facts[serving.PATCH_SHA] = "9f2c4e0d" * 8
    assert serving.plan_from_facts(s, facts).build["patch"] == "pr20547 sha256:9f2c4e0d9f2c4e0d"
    facts[serving.PATCH_SHA] = "1234abcd" * 8
    assert serving.plan_from_facts(s, facts).build["patch"] == "pr20547 sha256:1234abcd1234abcd"
    kind, args = serving.host_specs(s, [])[serving.PATCH_SHA]
    assert kind is FileText
    assert args == {"path": "/opt/specfleet/sglang/.specfleet/pr20547/sha256"}
