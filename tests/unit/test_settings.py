"""The typed settings object: merging over defaults and clear errors for bad data."""

import functools
from pathlib import Path

import pytest
from pyinfra.api import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory

from specfleet.core.settings import (
    Settings,
    SettingsError,
    settings_for_host,
    settings_from_dict,
    settings_from_layers,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_defaults_are_the_kimi_deploy():
    s = settings_from_dict(None)
    assert s == Settings()
    assert s.target.repo_id == "moonshotai/Kimi-K2.6"
    assert s.drafter.repo_id == "z-lab/Kimi-K2.6-DFlash" and s.drafter.gated
    assert s.port == 30000 and s.listen_host == "127.0.0.1"


def test_layers_merge_key_by_key_host_wins():
    group = {"target": {"revision": COMMIT}, "port": 31000, "plan": {"extra_env": {"A": "1"}}}
    host = {"port": 32000, "plan": {"extra_env": {"B": "2"}}}
    s = settings_from_layers([group, None, host], host="h1")
    assert s.port == 32000
    assert s.target.revision == COMMIT and s.target.repo_id == "moonshotai/Kimi-K2.6"
    assert s.plan.extra_env == {"A": "1", "B": "2"}


BAD = [
    ({"prot": 1}, "unknown settings key 'prot'"),
    ({"target": {"revison": COMMIT}}, "unknown settings key 'target.revison'"),
    ({"port": "30000"}, "settings key 'port' is '30000' (str), expected an integer"),
    ({"port": 70000}, "settings key 'port' is 70000, expected 1..65535"),
    ({"sglang": {"kind": "svn"}}, "settings key 'sglang.kind' is 'svn' (str), expected 'index' or 'git'"),
    ({"target": {"revision": "main"}}, "settings key 'target.revision' is 'main', which is not a commit"),
    ({"weights": {"stall_minutes": "3"}}, "settings key 'weights.stall_minutes' is '3' (str)"),
    ({"plan": {"tp_size": True}}, "settings key 'plan.tp_size' is True (bool), expected an integer"),
    ({"plan": {"mem_fraction_static": 1.5}}, "'plan.mem_fraction_static' is 1.5"),
    ({"target": "moonshotai/Kimi-K2.6"}, "settings key 'target' is 'moonshotai/Kimi-K2.6' (str)"),
    ({"launcher": "python3 x.py"}, "settings key 'launcher' is 'python3 x.py' (str), expected a list"),
    ({"patch": {"source": "/tmp/pr.diff"}}, "'patch.source' is set without 'patch.sha256'"),
    ({"sglang": {"kind": "git"}}, "'sglang.git_url' or 'sglang.git_ref' is unset"),
]


@pytest.mark.parametrize(("data", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_settings_name_key_host_and_fix(data, message):
    with pytest.raises(SettingsError) as err:
        settings_from_dict(data, host="gpu-7")
    text = str(err.value)
    assert text.startswith("[gpu-7] ")
    assert message in text
    assert "\n  fix: " in text


# --------------------------------------------------------------------------------------------------
# Every value checked at load: (what, data, the key the error names, a fragment of what it says)
# --------------------------------------------------------------------------------------------------

SHA = "ab" * 32
INF, NAN = float("inf"), float("nan")

BAD_VALUES = [
    # Paths on the host: absolute, normalized, no "..", not "/".
    ("relative models_root", {"models_root": "srv/models"}, "models_root", "'srv/models', expected an absolute path"),
    ("models_root is /", {"models_root": "/"}, "models_root", "other than / itself"),
    ("models_root with ..", {"models_root": "/srv/../etc"}, "models_root", "without '.' or '..' parts"),
    ("models_root with //", {"models_root": "/srv//models"}, "models_root", "normalized absolute path"),
    ("relative venv", {"venv": "venv"}, "venv", "'venv', expected an absolute path"),
    ("venv with .", {"venv": "/opt/./venv"}, "venv", "without '.' or '..' parts"),
    ("empty state_dir", {"state_dir": ""}, "state_dir", "expected an absolute path"),
    ("state_dir with newline", {"state_dir": "/var/lib/x\n"}, "state_dir", "without control characters"),
    ("relative host_token_path", {"weights": {"host_token_path": "token"}}, "weights.host_token_path", "absolute path"),
    # Paths on the control machine: absolute or under ~/.
    ("relative token_file", {"weights": {"token_file": "token.txt"}}, "weights.token_file", "an absolute path or one under ~/"),
    ("token_file escaping ~", {"weights": {"token_file": "~/../etc/shadow"}}, "weights.token_file", "a path under ~/ without '.' or '..'"),
    ("relative api_key_file", {"api_key_file": "key.txt"}, "api_key_file", "an absolute path or one under ~/"),
    ("relative patch source", {"patch": {"source": "../pr.diff", "sha256": SHA}}, "patch.source", "an absolute path or one under ~/"),
    ("patch over ftp", {"patch": {"source": "ftp://x/pr.diff", "sha256": SHA}}, "patch.source", "a URL with scheme"),
    ("relative mirror in a list", {"patch": {"source": ["/srv/mirror", "mirror"], "sha256": SHA}}, "patch.source", "an absolute path or one under ~/"),
    # Folder names under models_root.
    ("local_dir escaping", {"target": {"local_dir": "../escape"}}, "target.local_dir", "a folder name under models_root"),
    ("absolute local_dir", {"target": {"local_dir": "/abs/dir"}}, "target.local_dir", "no '/' or '..'"),
    ("nested local_dir", {"drafter": {"local_dir": "a/b"}}, "drafter.local_dir", "a folder name"),
    ("one folder for both", {"target": {"local_dir": "z-lab--Kimi-K2.6-DFlash"}}, "target", "'target' and 'drafter' resolve to one model folder"),
    ("same repo for both", {"drafter": {"repo_id": "moonshotai/Kimi-K2.6"}}, "drafter", "resolve to one model folder"),
    # Names fit for systemd units, file names and argv.
    ("service_name traversal", {"service_name": "../../../tmp/x"}, "service_name", "a systemd unit name"),
    ("empty service_name", {"service_name": ""}, "service_name", "a systemd unit name"),
    ("service_name with ;", {"service_name": "a;b"}, "service_name", "no '/', spaces or shell characters"),
    ("service_name with suffix", {"service_name": "sglang.service"}, "service_name", "without the '.service' suffix"),
    ("service_name too long", {"service_name": "s" * 65}, "service_name", "1-64 letters"),
    ("python with shell", {"python": "python3; rm -rf /"}, "python", "an interpreter's name on PATH or its absolute path"),
    ("listen_host not a host", {"listen_host": "not a host"}, "listen_host", "a host name or IP address"),
    ("backend with shell", {"plan": {"attention_backend": "fa3; rm"}}, "plan.attention_backend", "an attention backend's name"),
    # Repo ids as the Hub defines them; revisions.
    ("repo id without namespace", {"target": {"repo_id": "Kimi-K2.6"}}, "target.repo_id", "a Hugging Face repo id 'namespace/name'"),
    ("repo id with 3 parts", {"target": {"repo_id": "a/b/c"}}, "target.repo_id", "'namespace/name'"),
    ("repo id ..", {"target": {"repo_id": "moonshotai/.."}}, "target.repo_id", "no '--' or '..'"),
    ("repo id --", {"target": {"repo_id": "org/--name"}}, "target.repo_id", "'namespace/name'"),
    ("repo id trailing .", {"target": {"repo_id": "org/name."}}, "target.repo_id", "'namespace/name'"),
    ("repo id too long", {"drafter": {"repo_id": "org/" + "x" * 97}}, "drafter.repo_id", "at most 96 characters"),
    ("repo id with space", {"drafter": {"repo_id": "org/na me"}}, "drafter.repo_id", "'namespace/name'"),
    ("branch not pinned", {"target": {"revision": "main"}}, "target.revision", "which is not a commit sha"),
    ("followed ref with ..", {"target": {"revision": "../x", "follow_branch": True}}, "target.revision", "a branch, tag or commit"),
    ("git_ref with space", {"sglang": {"kind": "git", "git_url": "https://github.com/sgl-project/sglang.git", "git_ref": "a b"}}, "sglang.git_ref", "no spaces"),
    # Environment names and secrets in plan.extra_env.
    ("env name digit", {"plan": {"extra_env": {"1BAD": "x"}}}, "plan.extra_env.1BAD", "an environment variable's name"),
    ("env name dash", {"plan": {"extra_env": {"A-B": "x"}}}, "plan.extra_env.A-B", "an environment variable's name"),
    ("HF_TOKEN in extra_env", {"plan": {"extra_env": {"HF_TOKEN": "hf_x"}}}, "plan.extra_env.HF_TOKEN", "no secrets in plan.extra_env"),
    ("API key in extra_env", {"plan": {"extra_env": {"OPENAI_API_KEY": "x"}}}, "plan.extra_env.OPENAI_API_KEY", "no secrets"),
    ("password in extra_env", {"plan": {"extra_env": {"DB_PASSWORD": "x"}}}, "plan.extra_env.DB_PASSWORD", "no secrets"),
    ("secret in extra_env", {"plan": {"extra_env": {"client_secret": "x"}}}, "plan.extra_env.client_secret", "no secrets"),
    ("env value newline", {"plan": {"extra_env": {"A": "x\ny"}}}, "plan.extra_env.A", "without newlines"),
    # Flags and secrets in plan.extra_args.
    ("--api-key in extra_args", {"plan": {"extra_args": {"--api-key": "sk-1"}}}, "plan.extra_args.--api-key", "no secrets in plan.extra_args"),
    ("--admin-api-key", {"plan": {"extra_args": {"--admin-api-key": "sk-1"}}}, "plan.extra_args.--admin-api-key", "no secrets"),
    ("--hf-token", {"plan": {"extra_args": {"--hf-token": "hf_x"}}}, "plan.extra_args.--hf-token", "no secrets"),
    ("--ssl-keyfile-password", {"plan": {"extra_args": {"--ssl-keyfile-password": "pw"}}}, "plan.extra_args.--ssl-keyfile-password", "no secrets"),
    ("not a long flag", {"plan": {"extra_args": {"context-length": 1}}}, "plan.extra_args", "long flags as keys"),
    ("flag with =value", {"plan": {"extra_args": {"--context-length=4": True}}}, "plan.extra_args", "no '=value'"),
    ("arg value newline", {"plan": {"extra_args": {"--served-model-name": "a\nb"}}}, "plan.extra_args.--served-model-name", "without newlines"),
    ("--config with a key", {"api_key_file": "/etc/specfleet/key", "plan": {"extra_args": {"--config": "/x.yaml"}}}, "plan.extra_args.--config", "no --config while an API key is set"),
    # Versions and specifiers that packaging parses; hashes.
    ("garbage sglang.version", {"sglang": {"version": "garbage"}}, "sglang.version", "a version that packaging parses"),
    ("empty sglang.version", {"sglang": {"version": ""}}, "sglang.version", "PEP 440"),
    ("bad specifier", {"sglang": {"compressed_tensors": "latest"}}, "sglang.compressed_tensors", "a version specifier"),
    ("short sha256", {"patch": {"source": "/tmp/pr.diff", "sha256": "abc"}}, "patch.sha256", "64 hex digits"),
    # Numbers in range.
    ("negative margin_percent", {"weights": {"margin_percent": -1}}, "weights.margin_percent", "a number in [0, 100)"),
    ("negative margin_min_gib", {"weights": {"margin_min_gib": -0.5}}, "weights.margin_min_gib", "a number >= 0"),
    ("zero poll_seconds", {"weights": {"poll_seconds": 0}}, "weights.poll_seconds", "a number > 0"),
    ("negative stall_minutes", {"weights": {"stall_minutes": -1}}, "weights.stall_minutes", "a number > 0"),
    ("infinite stall_minutes", {"weights": {"stall_minutes": INF}}, "weights.stall_minutes", "is inf, expected a number > 0"),
    ("zero readiness timeout", {"readiness_timeout_s": 0}, "readiness_timeout_s", "a number > 0"),
    ("NaN readiness timeout", {"readiness_timeout_s": NAN}, "readiness_timeout_s", "is nan"),
    ("zero batch_size", {"rollout": {"batch_size": 0}}, "rollout.batch_size", ">= 1"),
    ("zero batch_percent", {"rollout": {"batch_percent": 0}}, "rollout.batch_percent", "a number in (0, 100]"),
    ("batch_percent 150", {"rollout": {"batch_percent": 150}}, "rollout.batch_percent", "(0, 100]"),
    ("negative max_fail_percent", {"rollout": {"max_fail_percent": -1}}, "rollout.max_fail_percent", "[0, 100]"),
    ("max_fail_percent 101", {"rollout": {"max_fail_percent": 101}}, "rollout.max_fail_percent", "[0, 100]"),
    ("batch size and percent", {"rollout": {"batch_size": 2, "batch_percent": 50}}, "rollout.batch_size", "are both set"),
    ("host twice in order", {"rollout": {"order": ["a", "a"]}}, "rollout.order[1]", "a host name not listed before"),
    ("port 0", {"port": 0}, "port", "expected 1..65535"),
    ("zero draft window", {"plan": {"draft_window_size": 0}}, "plan.draft_window_size", ">= 1"),
    ("zero tp_size", {"plan": {"tp_size": 0}}, "plan.tp_size", ">= 1"),
    # URL schemes: the token goes to hf_endpoint; pip's indexes over http only to trusted hosts.
    ("hf_endpoint over http", {"weights": {"hf_endpoint": "http://mirror.example:8080"}}, "weights.hf_endpoint", "plain http:// only to a loopback address or to a host listed in weights.allow_http_hosts"),
    ("hf_endpoint over ftp", {"weights": {"hf_endpoint": "ftp://hub.example"}}, "weights.hf_endpoint", "a URL with scheme https:// or http://"),
    ("hf_endpoint without host", {"weights": {"hf_endpoint": "https://"}}, "weights.hf_endpoint", "a URL with a host, such as https://HOST/"),
    ("hf_endpoint without scheme", {"weights": {"hf_endpoint": "hf.co"}}, "weights.hf_endpoint", "a URL with scheme"),
    ("http allowed for another host", {"weights": {"hf_endpoint": "http://evil.example", "allow_http_hosts": ["mirror.lan"]}}, "weights.hf_endpoint", "an https:// URL"),
    ("index_url over http", {"sglang": {"index_url": "http://pypi.internal/simple"}}, "sglang.index_url", "a host listed in sglang.trusted_hosts"),
    ("find_links over http", {"sglang": {"find_links": "http://10.0.0.5:8000/"}}, "sglang.find_links", "sglang.trusted_hosts"),
    ("relative find_links", {"sglang": {"find_links": "wheels"}}, "sglang.find_links", "a URL or an absolute path"),
    ("git_url over ftp", {"sglang": {"kind": "git", "git_url": "ftp://x/y", "git_ref": "main"}}, "sglang.git_url", "a URL with scheme"),
    ("bad allow_http_hosts", {"weights": {"allow_http_hosts": ["not a host!"]}}, "weights.allow_http_hosts[0]", "a host name or IP address"),
    ("bad trusted host", {"sglang": {"trusted_hosts": ["bad host"]}}, "sglang.trusted_hosts[0]", "a host name or IP address"),
    # Accepted before #33, dangerous: refused with the key and a fix.
    ("version with a newline", {"sglang": {"version": "0.5.23\n"}}, "sglang.version", "without spaces or newlines"),
    ("version with a space", {"sglang": {"version": " 0.5.23"}}, "sglang.version", "without spaces or newlines"),
    ("models_root in state_dir", {"models_root": "/var/lib/specfleet/models"}, "models_root", "apart from state_dir"),
    ("state_dir in models_root", {"state_dir": "/srv/models/state"}, "models_root", "neither inside the other"),
    ("models_root is state_dir", {"models_root": "/var/lib/specfleet/"}, "models_root", "apart from state_dir"),
    ("fan-out sshd for ever", {"rollout": {"fanout_serve_hours": 1e6}}, "rollout.fanout_serve_hours", "a number in (0, 24]"),
    ("watchdog that never probes", {"watchdog": {"interval_s": 1e9}}, "watchdog.interval_s", "a number in (0, 3600]"),
    ("git url option injection", {"sglang": {"kind": "git", "git_url": "git+ssh://-oProxyCommand=id/x", "git_ref": "main"}}, "sglang.git_url", "host is a host name or IP address"),
    ("git url injection with user", {"sglang": {"kind": "git", "git_url": "ssh://git@-oProxyCommand=id/x", "git_ref": "main"}}, "sglang.git_url", "host is a host name"),
    ("logging config in extra_env", {"plan": {"extra_env": {"SGLANG_LOGGING_CONFIG_PATH": "/tmp/l.json"}}}, "plan.extra_env.SGLANG_LOGGING_CONFIG_PATH", "how it logs"),
    ("LD_PRELOAD in extra_env", {"plan": {"extra_env": {"LD_PRELOAD": "/tmp/x.so"}}}, "plan.extra_env.LD_PRELOAD", "changes what code the server runs"),
    ("LD_LIBRARY_PATH in extra_env", {"plan": {"extra_env": {"LD_LIBRARY_PATH": "/tmp"}}}, "plan.extra_env.LD_LIBRARY_PATH", "changes what code"),
    ("PYTHONPATH in extra_env", {"plan": {"extra_env": {"PYTHONPATH": "/tmp"}}}, "plan.extra_env.PYTHONPATH", "changes what code"),
    ("PYTHONSTARTUP in extra_env", {"plan": {"extra_env": {"PYTHONSTARTUP": "/tmp/x.py"}}}, "plan.extra_env.PYTHONSTARTUP", "changes what code"),
    ("hf_endpoint backslash", {"weights": {"hf_endpoint": "http://evil.example\\@127.0.0.1/"}}, "weights.hf_endpoint", "without backslashes"),
    ("hf_endpoint userinfo", {"weights": {"hf_endpoint": "https://evil.example@hf.co/"}}, "weights.hf_endpoint", "without user or password"),
    ("hf_endpoint percent host", {"weights": {"hf_endpoint": "https://127.0.0.1%2f.evil.example/"}}, "weights.hf_endpoint", "without percent-encoding"),
    ("hf_endpoint numeric name", {"weights": {"hf_endpoint": "https://127.1:8080/"}}, "weights.hf_endpoint", "host is a host name or IP address"),
    ("index_url with password", {"sglang": {"index_url": "https://user:pw@pypi.internal/simple"}}, "sglang.index_url", "without user or password"),
    ("find_links with user", {"sglang": {"find_links": "https://u@10.0.0.5/w"}}, "sglang.find_links", "without user or password"),
    ("patch URL backslash", {"patch": {"source": "https://a.example\\@b.example/p.diff", "sha256": SHA}}, "patch.source", "without backslashes"),
    # Secrets.
    ("empty api_key", {"api_key": ""}, "api_key", "omit api_key for a server without a key"),
    ("api_key with newline", {"api_key": "sk-a\nb"}, "api_key", "not shown: it is a secret"),
    ("api_key with spaces", {"api_key": "sk-with spaces and \"quotes\""}, "api_key", "without spaces"),
    ("api_key and api_key_file", {"api_key": "sk-1", "api_key_file": "/etc/k"}, "api_key_file", "are both set"),
    ("token_file and token_env", {"weights": {"token_file": "/t", "token_env": "HF_TOKEN"}}, "weights.token_env", "are both set"),
    ("token_env not a name", {"weights": {"token_env": "hf abc"}}, "weights.token_env", "the name, not the token"),
    ("token pasted as token_env", {"weights": {"token_env": "hf_" + "x" * 34}}, "weights.token_env", "looks like a Hugging Face token (not shown)"),
    # Test-only settings, without SPECFLEET_ALLOW_TEST_SETTINGS=1.
    ("launcher outside tests", {"launcher": ["/usr/bin/python3", "/srv/standin.py"]}, "launcher", "'launcher' is a test-only setting"),
    ("no_deps outside tests", {"sglang": {"no_deps": True}}, "sglang.no_deps", "'sglang.no_deps' is a test-only setting"),
    ("test_recipe outside tests", {"patch": {"test_recipe": "/tmp/recipe.json"}}, "patch.test_recipe", "'patch.test_recipe' is a test-only setting"),
]


@pytest.mark.parametrize(("data", "key", "fragment"), [b[1:] for b in BAD_VALUES],
                         ids=[b[0] for b in BAD_VALUES])
def test_every_bad_value_names_host_key_found_and_fix(data, key, fragment, monkeypatch):
    monkeypatch.delenv("SPECFLEET_ALLOW_TEST_SETTINGS", raising=False)
    with pytest.raises(SettingsError) as err:
        settings_from_dict(data, host="gpu-7")
    text = str(err.value)
    assert text.startswith("[gpu-7] "), text
    assert f"'{key}" in text, text
    assert fragment in text, text
    assert "\n  fix: " in text, text
    assert "Traceback" not in text
    # A secret given in the data is never quoted back.
    for secret in ("sk-1", "hf_x", "sk-a\nb", "pw", "hf_" + "x" * 34):
        if secret in repr(data):
            assert repr(secret) not in text and f"={secret}" not in text, text


def test_there_are_at_least_forty_bad_values():
    assert len(BAD_VALUES) >= 40


def test_a_host_gets_its_unknown_key_wrong_type_bad_value_and_conflict_in_one_error():
    data = {"tagret": {"revision": COMMIT}, "readiness_timeout_s": "ten minutes", "port": 70000,
            "rollout": {"batch_size": 2, "batch_percent": 50}}
    with pytest.raises(SettingsError) as err:
        settings_from_dict(data, host="gpu-7")
    text = str(err.value)
    assert text.startswith("[gpu-7] 4 settings are bad:\n"), text
    assert "[gpu-7] unknown settings key 'tagret' (did you mean 'target'?)" in text
    assert "fix: rename it to 'target', or remove it" in text
    assert ("[gpu-7] settings key 'readiness_timeout_s' is 'ten minutes' (str), expected a "
            "number") in text
    assert "[gpu-7] settings key 'port' is 70000, expected 1..65535" in text
    assert "'rollout.batch_size' and 'rollout.batch_percent' are both set" in text
    assert "Traceback" not in text


def test_a_bad_key_does_not_hide_a_conflict_of_keys_that_validated():
    # The section with a bad key still has its conflicts checked; a conflict over a bad key is not
    # reported twice.
    with pytest.raises(SettingsError) as err:
        settings_from_dict({"weights": {"token_file": "/t", "token_env": "HF_TOKEN",
                                        "margin_percent": -1},
                            "patch": {"source": "rel/pr.diff"}}, host="h")
    text = str(err.value)
    assert "'weights.margin_percent' is -1" in text
    assert "'weights.token_file' and 'weights.token_env' are both set" in text
    assert "'patch.source' is 'rel/pr.diff'" in text
    assert "set without 'patch.sha256'" not in text


def test_unknown_keys_far_from_any_name_list_the_section_keys():
    with pytest.raises(SettingsError) as err:
        settings_from_dict({"watchdog": {"zzz": 1}}, host="h")
    text = str(err.value)
    assert "unknown settings key 'watchdog.zzz'" in text and "did you mean" not in text
    assert "use one of: backoff_max_s, backoff_s, enable," in text


def test_a_secret_of_the_wrong_type_is_not_quoted():
    with pytest.raises(SettingsError) as err:
        settings_from_dict({"api_key": ["sk-live-123"]}, host="h")
    assert "sk-live-123" not in str(err.value)
    assert "settings key 'api_key' is a list (not shown: it is a secret)" in str(err.value)


GOOD_VALUES = [
    {"models_root": "/data/models/", "venv": "/root/venv_sglang211/", "state_dir": "/var/lib/sf"},
    {"service_name": "sglang@kimi"}, {"service_name": "sf-k26.prod_1"},
    {"python": "/usr/bin/python3.11"}, {"python": "python3.12"},
    {"listen_host": "0.0.0.0"}, {"listen_host": "::"}, {"listen_host": "localhost"},
    {"target": {"repo_id": "Org-1/Model.Name_2", "local_dir": "k26"}},
    {"target": {"revision": "refs/pr/1", "follow_branch": True}},
    {"drafter": {"revision": "v1.2", "follow_branch": True}},
    {"target": {"revision": COMMIT}, "drafter": {"revision": COMMIT}},
    {"plan": {"extra_env": {"TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": "0,1",
                            "NCCL_DEBUG": "INFO", "_X": "a b $HOME"}}},
    {"plan": {"extra_args": {"--speculative-num-draft-tokens": 8, "--ssl-keyfile": "/etc/k.pem",
                             "--tokenizer-path": "/m/tok", "--max-total-tokens": 4096,
                             "--enable-metrics": True, "--api-key": None, "--disable-x": False}}},
    {"plan": {"extra_args": {"--config": "/etc/sglang.yaml"}}},
    {"weights": {"hf_endpoint": "https://hf-mirror.com"}},
    {"weights": {"hf_endpoint": "http://127.0.0.1:8080"}},
    {"weights": {"hf_endpoint": "http://[::1]:9000"}},
    {"weights": {"hf_endpoint": "http://localhost:9000/hub"}},
    {"weights": {"hf_endpoint": "http://mirror.lan:8080", "allow_http_hosts": ["mirror.lan"]}},
    {"weights": {"hf_endpoint": "http://10.250.3.1:4567", "allow_http_hosts": ["10.250.3.1"]}},
    {"weights": {"token_file": "~/.cache/huggingface/token"}},
    {"weights": {"token_file": "/etc/specfleet/hf-token"}},
    {"weights": {"token_env": "HF_TOKEN_PROD"}},
    {"weights": {"margin_percent": 0, "margin_min_gib": 0, "poll_seconds": 0.1,
                 "stall_minutes": 0.2}},
    {"sglang": {"find_links": "/opt/wheels"}}, {"sglang": {"find_links": "file:///opt/wheels"}},
    {"sglang": {"find_links": "http://10.0.0.5:8000/", "trusted_hosts": ["10.0.0.5"]}},
    {"sglang": {"index_url": "http://pypi.lan:3141/simple", "trusted_hosts": ["pypi.lan:3141"]}},
    {"sglang": {"index_url": "https://pypi.internal/simple"}},
    {"sglang": {"kind": "git", "git_ref": "main",
                "git_url": "git+ssh://git@github.com/sgl-project/sglang.git#subdirectory=python"}},
    {"plan": {"extra_env": {"SGLANG_ENABLE_JIT_DEEPGEMM": "1", "PYTHONUNBUFFERED": "1",
                            "MALLOC_ARENA_MAX": "2"}}},
    {"models_root": "/var/lib/models", "state_dir": "/var/lib/specfleet"},
    {"rollout": {"fanout_serve_hours": 24}, "watchdog": {"interval_s": 3600}},
    {"sglang": {"kind": "git", "git_ref": "dflash_v2",
                "git_url": "git+https://github.com/sgl-project/sglang.git#subdirectory=python"}},
    {"sglang": {"kind": "git", "git_ref": COMMIT,
                "git_url": "git+file:///srv/sglang#subdirectory=python"}},
    {"sglang": {"version": "0.5.14rc1", "compressed_tensors": ">=0.15.0.1,<0.19"}},
    {"sglang": {"version": "0.5.11.dev12+g1234"}},
    {"patch": {"source": "https://example.org/pr20547.diff", "sha256": SHA}},
    {"patch": {"source": "~/pr20547.diff", "sha256": SHA.upper()}},
    {"patch": {"source": "http://10.0.0.9/pr.diff", "sha256": SHA}},
    {"patch": {"sha256": SHA}},  # the recipe's own pinned URLs
    {"patch": {"source": ["/srv/mirror", "https://mirror.example.org/sglang"], "sha256": SHA}},
    {"api_key": "sk-with-\"quotes\"-'and'-\\-.*+?"}, {"api_key_file": "~/.specfleet/api-key"},
    {"rollout": {"batch_percent": 100, "max_fail_percent": 0, "order": ["a", "b"],
                 "canary": "a", "fanout_site": "rack-1"}},
    {"rollout": {"batch_size": 1, "max_fail_percent": 100}},
    {"readiness_timeout_s": 0.5, "port": 65535},
]


@pytest.mark.parametrize("data", GOOD_VALUES, ids=[repr(g)[:60] for g in GOOD_VALUES])
def test_good_values_are_accepted(data, monkeypatch):
    monkeypatch.delenv("SPECFLEET_ALLOW_TEST_SETTINGS", raising=False)
    settings_from_dict(data, host="gpu-7")


def test_test_only_settings_need_the_environment_variable(monkeypatch):
    data = {"launcher": ["/usr/bin/python3", "/srv/standin.py", ";", ""],
            "sglang": {"no_deps": True}, "patch": {"test_recipe": "/tmp/recipe.json"}}
    monkeypatch.delenv("SPECFLEET_ALLOW_TEST_SETTINGS", raising=False)
    with pytest.raises(SettingsError, match="3 settings are bad"):
        settings_from_dict(data, host="h")
    for value in ("0", "true", ""):
        with pytest.raises(SettingsError):
            settings_from_dict(data, host="h", environ={"SPECFLEET_ALLOW_TEST_SETTINGS": value})
    s = settings_from_dict(data, host="h", environ={"SPECFLEET_ALLOW_TEST_SETTINGS": "1"})
    assert s.launcher[0] == "/usr/bin/python3" and s.sglang.no_deps
    assert s.patch.test_recipe == "/tmp/recipe.json"
    monkeypatch.setenv("SPECFLEET_ALLOW_TEST_SETTINGS", "1")
    assert settings_from_dict(data, host="h").sglang.no_deps
    # Unset or false, they are no test-only setting at all.
    monkeypatch.delenv("SPECFLEET_ALLOW_TEST_SETTINGS")
    assert settings_from_dict({"launcher": None, "sglang": {"no_deps": False}}).launcher is None
    with pytest.raises(SettingsError, match="a command: a program, then its arguments"):
        settings_from_dict({"launcher": []}, environ={"SPECFLEET_ALLOW_TEST_SETTINGS": "1"})


def test_all_problems_of_a_host_are_reported_together():
    with pytest.raises(SettingsError) as err:
        settings_from_dict({"models_root": "models", "service_name": "a/b", "api_key": ""},
                           host="h9")
    text = str(err.value)
    assert text.startswith("[h9] 3 settings are bad:\n")
    for key in ("models_root", "service_name", "api_key"):
        assert f"[h9] settings key '{key}' is" in text
    assert text.count("\n  fix: ") == 4


def test_every_inventory_loads():
    from specfleet.core.settings import check_inventory_settings

    # Every inventory file (not group data); first_host.py holds placeholders on purpose and is
    # refused with the fix (tests/unit/test_examples.py).
    inventories = sorted(p for p in Path("inventories").rglob("*.py")
                         if "group_data" not in p.parts and p.name != "first_host.py")
    assert {p.name for p in inventories} >= {"ct200.py", "fleet_example.py"}
    for path in inventories:
        ctx_state.set(State())
        hosts = check_inventory_settings(make_inventory(str(path)))
        assert hosts, path


def test_specfleet_data_must_be_a_mapping():
    with pytest.raises(SettingsError, match=r"\[h\] 'specfleet' data is list, expected a mapping"):
        settings_from_layers([["port", 1]], host="h")


def _inventory_settings(path):
    ctx_state.set(State())
    return {h.name: settings_for_host(h) for h in make_inventory(path)}


def test_ct200_inventory_reuses_its_venv_and_follows_main_on_purpose():
    # Loads the inventory file only: nothing connects to CT200.
    s = _inventory_settings("inventories/ct200.py")["ct200"]
    assert s.venv == "/root/venv_sglang211"
    assert s.sglang.version == "0.5.11"
    assert s.models_root == "/root/models"
    assert s.target.follow_branch and s.target.revision == "main"
    # Opted in to the PR#20547 port by its pin alone: nothing a fresh clone lacks is named.
    assert s.patch.sha256 == "1c844c0fdcab59266c0b1bb46e2099b86469364ffd5ad5ac436f1a7f2847d252"
    assert s.patch.source is None


def test_fleet_example_group_data_differs_by_arch():
    hosts = _inventory_settings("inventories/fleet_example/fleet_example.py")
    assert hosts["rtx-a1"].plan.mem_fraction_static == 0.85
    assert hosts["b200-02"].plan.mem_fraction_static == 0.9
    assert hosts["h200-01"].plan.draft_attention_backend == "fa3"
    assert hosts["h200-01"].port == 30001
    # The fleet-wide group still reaches every host.
    assert {s.sglang.version for s in hosts.values()} == {"0.5.23"}


def test_every_bad_key_of_every_host_is_listed_in_one_error(tmp_path):
    inv = tmp_path / "inv.py"
    inv.write_text(
        "hosts = [\n"
        "    ('a', {'specfleet': {'port': 'x', 'venv': 'rel'}}),\n"
        "    ('b', {'specfleet': {'port': 30001}}),\n"
        "    ('c', {'specfleet': {'prot': 1, 'metrics': {'relay_port': 30000}}}),\n"
        "]\n"
    )
    from specfleet.core.settings import check_inventory_settings

    ctx_state.set(State())
    with pytest.raises(SettingsError) as err:
        check_inventory_settings(make_inventory(str(inv)))
    text = str(err.value)
    assert "2 hosts have bad settings" in text
    assert "[a] settings key 'port' is 'x'" in text
    assert "[a] settings key 'venv' is 'rel', expected an absolute path" in text
    assert "[c] unknown settings key 'prot' (did you mean 'port'?)" in text
    assert "[c] settings key 'metrics.relay_port' is the server's port 30000" in text
    assert "[b]" not in text


def test_a_type_fix_names_the_key_as_the_data_spells_it():
    # Not specfleet['plan.tp_size']: written that way it is one more unknown key.
    with pytest.raises(SettingsError) as err:
        settings_from_dict({"plan": {"tp_size": "8"}, "probe": {"questions": [{"prompt": 1}]}},
                           host="h")
    text = str(err.value)
    assert ("fix: set specfleet['plan']['tp_size'] to an integer or null where it is given (the "
            "host or group data, or --data)") in text
    assert "specfleet['probe']['questions'][0]['answer']" in text  # a required key, by index
    assert "specfleet['plan.tp_size']" not in text


def test_settings_where_specfleet_does_not_read_them_are_refused_not_ignored(tmp_path):
    # pyinfra keeps any data key: settings beside 'specfleet' would be dropped without a word and
    # the deploy would run on the defaults (another models_root, another SGLang).
    inv = tmp_path / "inv.py"
    inv.write_text(
        "hosts = [\n"
        "    ('flat', {'ssh_hostname': 'h', 'models_root': '/data', 'sglang': {'version': '0.5.11'}}),\n"
        "    ('typo', {'specfleat': {'port': 30001}}),\n"
        "    ('case', {'Specfleet': {'port': 30001}}),\n"
        "    ('ok', {'specfleet': {'port': 30001}, 'specfleet_bench': {}, 'port': 22}),\n"
        "    ('defaults', {'ssh_user': 'root', 'colour': 'blue'}),\n"
        "]\n"
    )
    from specfleet.core.settings import check_inventory_settings

    ctx_state.set(State())
    inventory = make_inventory(str(inv))
    with pytest.raises(SettingsError) as err:
        check_inventory_settings(inventory)
    text = str(err.value)
    assert "3 hosts have bad settings" in text
    assert ("[flat] data 'models_root', 'sglang' at the top level, where specfleet does not read "
            "settings") in text
    assert "fix: move them under 'specfleet': {'specfleet': {'models_root': ...}}" in text
    assert "[typo] data key 'specfleat' is not read (did you mean 'specfleet'?)" in text
    assert "[case] data key 'Specfleet' is not read" in text
    assert "fix: rename it to 'specfleet'" in text
    # Beside real specfleet data a top-level 'port' is someone else's; specfleet_* keys are the
    # deploys' own (specfleet_bench, specfleet_sweep); a host of no settings names is the defaults.
    assert "[ok]" not in text and "[defaults]" not in text
    hosts = {h.name: h for h in inventory}
    assert settings_for_host(hosts["ok"]).port == 30001
    assert settings_for_host(hosts["defaults"]).port == 30000


def check_with_data(inv: Path, override: dict) -> dict:
    """check_inventory_settings on ``inv`` with ``override`` as pyinfra's --data gives it."""
    from specfleet.core.settings import check_inventory_settings

    ctx_state.set(State())
    return check_inventory_settings(make_inventory(str(inv), override_data=override))


def test_settings_given_to_data_as_pyinfra_takes_it_but_specfleet_does_not_are_refused(tmp_path):
    inv = tmp_path / "inv.py"
    inv.write_text("hosts = [('a', {'specfleet': {'port': 30001}})]\n")
    check = functools.partial(check_with_data, inv)

    with pytest.raises(SettingsError) as err:
        check({"port": 30005})  # --data port=30005
    text = str(err.value)
    assert "[a] --data 'port': a setting outside 'specfleet', which specfleet does not read" in text
    assert "fix: pass --data 'specfleet={\"port\": ...}'" in text
    with pytest.raises(SettingsError) as err:
        check({"specfleet.plan.tp_size": 4})  # --data specfleet.plan.tp_size=4
    text = str(err.value)
    assert "[a] data key 'specfleet.plan.tp_size' is not read: pyinfra does not split" in text
    assert 'fix: nest it: specfleet={"plan": {"tp_size": ...}}' in text
    # The way that works merges over the inventory's settings key by key.
    s = check({"specfleet": {"plan": {"tp_size": 4}}, "ssh_user": "ubuntu"})["a"]
    assert (s.port, s.plan.tp_size) == (30001, 4)


def test_a_bad_data_value_is_said_once_naming_the_hosts_it_reaches(tmp_path):
    """--data (or a group's data) reaches many hosts with the same bad value: one problem, said
    once with the hosts it applies to, not a copy per host."""
    inv = tmp_path / "inv.py"
    inv.write_text("hosts = [('a', {}), ('b', {}), ('c', {}), ('d', {'specfleet': {'prot': 1}})]\n")
    check = functools.partial(check_with_data, inv)

    with pytest.raises(SettingsError) as err:
        check({"specfleet.port": "x"})  # --data specfleet.port=x: every host
    text = str(err.value)
    assert text.count("data key 'specfleet.port' is not read") == 1, text
    assert text.count('fix: nest it: specfleet={"port": ...}') == 1, text
    assert text.startswith("[all 4 hosts] data key 'specfleet.port'"), text
    with pytest.raises(SettingsError) as err:
        check({"specfleet": {"port": "x"}})  # d has a problem of its own besides
    text = str(err.value)
    assert text.startswith("4 hosts have bad settings:\n"), text
    assert text.count("settings key 'port' is 'x' (str), expected an integer") == 2, text
    assert "[a, b, c] settings key 'port' is 'x'" in text
    assert "[d] 2 settings are bad:" in text and "[d] unknown settings key 'prot'" in text


def test_settings_nested_under_specfleet_twice_say_to_unwrap_them():
    # `specfleet plan --settings` takes the settings themselves: a copy of an inventory's
    # {"specfleet": {...}} gets the fix that works, not "remove it".
    with pytest.raises(SettingsError) as err:
        settings_from_dict({"specfleet": {"port": 30001}}, host="h")
    text = str(err.value)
    assert "[h] unknown settings key 'specfleet': these are the settings already" in text
    assert "up one level" in text and "remove it" not in text


def test_fleet_example_agrees_on_one_rollout():
    from specfleet.fleet.rollout import resolve_options

    hosts = _inventory_settings("inventories/fleet_example/fleet_example.py")
    options = resolve_options({h: s.rollout for h, s in hosts.items()}, {})
    assert options.canary == "b200-01" and options.batch_percent == 25.0


def test_the_docs_settings_reference_is_the_models_json_schema():
    from tests.unit.settings_reference import BEGIN, END, reference

    readme = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text()
    block = readme[readme.index(BEGIN):readme.index(END) + len(END)]
    assert block == reference(), "run: python -m tests.unit.settings_reference docs/settings.md"
    for key in ("`port`", "`target.revision`", "`group.members`", "`watchdog.interval_s`"):
        assert key in block
