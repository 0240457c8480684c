"""``facts.hostpy``: ``installed_dists`` against ``importlib.metadata`` on real environments,
and ``parse_printed`` on what the host-side scripts print."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import venv

import pytest

from facts.hostpy import installed_dists, parse_printed


def metadata_view(paths: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for dist in md.distributions(path=paths):
        name = dist.metadata["Name"]
        if name and name not in out:
            out[name] = {"version": dist.version, "direct_url": dist.read_text("direct_url.json")}
    return out


def test_same_as_importlib_metadata_on_this_venv():
    """Every distribution of the project's own venv (pyinfra, huggingface_hub, specfleet...)
    reads the same as importlib.metadata reads it."""
    got = installed_dists(sys.path)
    want = metadata_view(sys.path)
    assert len(want) > 30 and {"pyinfra", "huggingface_hub", "specfleet"} <= set(want)
    assert got == want


def test_first_on_the_path_wins_and_odd_entries_are_skipped(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for base, version in ((first, "2.0"), (second, "1.0")):
        info = base / f"demo_pkg-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: demo-pkg\nVersion: {version}\n\nName: not-a-header\n")
    (second / "broken-1.0.dist-info").mkdir()  # no METADATA: skipped, as importlib does
    (second / "old_style.egg-info").write_text("Metadata-Version: 1.0\nName: old-style\n"
                                               "Version: 0.1\n")
    paths = [str(first), str(second), str(tmp_path / "missing")]
    got = installed_dists(paths)
    assert got == {"demo-pkg": {"version": "2.0", "direct_url": None},
                   "old-style": {"version": "0.1", "direct_url": None}}
    assert got == metadata_view(paths)


@pytest.mark.local
def test_a_fresh_venv_through_the_packages_fact_script(tmp_path):
    """The Packages fact's own script in a real new venv (pip only) matches its metadata."""
    from facts.python import COLLECT

    venv.create(tmp_path / "v", with_pip=True)
    python = str(tmp_path / "v" / "bin" / "python")
    out = subprocess.run([python, "-I", "-c", COLLECT, "pip"], capture_output=True,
                         text=True, check=True).stdout
    value = parse_printed(out)
    pip_version = subprocess.run([python, "-I", "-c", "import pip; print(pip.__version__)"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    assert value["dists"]["pip"]["version"] == pip_version
    assert value["python"] == sys.version.split()[0]


def test_parse_printed_reads_literals_and_json():
    value = {"a": [1, 2.5, None, True], "b": {"c": "d'e"}}
    assert parse_printed(repr(value)) == value
    assert parse_printed('{"a": [1, 2.5, null, true], "b": {"c": "d\'e"}}') == value
    assert parse_printed("None") is None and parse_printed("null") is None


def test_dist_version_is_importlib_metadata_version():
    from facts.hostpy import dist_version

    for name in ("pyinfra", "huggingface_hub", "Huggingface-Hub", "typing.extensions"):
        try:
            want = md.version(name)
        except md.PackageNotFoundError:
            want = None
        assert dist_version(sys.path, name) == want, name
    assert dist_version(sys.path, "pyinfra") is not None
    assert dist_version(sys.path, "no-such-dist") is None


def _interpreters() -> list[str]:
    import glob
    import shutil

    # 3.8 and later: what a GPU host's system Python may be (Ubuntu 20.04 has 3.8).
    found = {sys.executable}
    for m in range(8, 15):
        found |= set(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{m}.*/bin/python")))
        path = shutil.which(f"python3.{m}")
        if path and "/shims/" not in path:  # a pyenv shim runs only the selected version
            found.add(path)
    return sorted(found)


@pytest.mark.local
@pytest.mark.parametrize("python", _interpreters())
def test_host_scripts_run_on_every_python_at_hand(python):
    """The host-side scripts define annotated functions (``str | None``): a host's Python 3.8 or
    3.9 must not evaluate them (``host_source`` makes them lazy)."""
    from facts import python as python_fact
    from facts import sglang, weights

    scripts = {
        "Packages": (python_fact.COLLECT, ["pip"]),
        "SGLangInstall": (sglang.COLLECT, [sglang.collect_request()]),
        "WeightsTools": (weights._TOOLS_SCRIPT, ["/nonexistent"]),
        "WeightsState": (weights._STATE_SCRIPT, ["/nonexistent", "in-use"]),
    }
    for name, (source, args) in scripts.items():
        done = subprocess.run([python, "-I", "-c", source, *args], capture_output=True, text=True)
        assert done.returncode == 0, (name, done.stderr)
        value = parse_printed(done.stdout.strip())
        assert name == "SGLangInstall" and value is None or isinstance(value, dict), name


@pytest.mark.local
@pytest.mark.parametrize("python", _interpreters())
def test_site_paths_are_what_site_puts_on_sys_path(python):
    """``site_paths`` under -I -S (the fact scripts' flags) finds the folders ``site`` puts on
    sys.path under -I, in order, and the editable installs' finders' folders (this checkout's
    own venv has one: specfleet), on every Python at hand, venv or not."""
    from facts.hostpy import host_source
    from specfleet.hostside.dists import editable_packages, site_paths

    script = host_source(site_paths, editable_packages) + (
        "import sys\nprint(repr([site_paths(), editable_packages(site_paths()), sys.path]))\n")
    done = subprocess.run([python, "-I", "-S", "-c", script], capture_output=True, text=True,
                          check=True)
    found, editable, bare = parse_printed(done.stdout)
    with_site = subprocess.run([python, "-I", "-c", "import sys; print(repr(sys.path))"],
                               capture_output=True, text=True, check=True)
    want = [p for p in parse_printed(with_site.stdout)
            if p not in bare and not p.endswith(".__path_hook__")]
    assert found == want
    if python == sys.executable and "__editable__" in " ".join(os.listdir(found[0])):
        spec = subprocess.run(
            [python, "-I", "-c", "import importlib.util as u; "
             "print(u.find_spec('specfleet').submodule_search_locations[0])"],
            capture_output=True, text=True, check=True, cwd="/")
        assert editable["specfleet"] == spec.stdout.strip()

