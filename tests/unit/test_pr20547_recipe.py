"""The PR#20547 port as a recipe (``specfleet/patchdata/pr20547/sglang-0.5.11/recipe.json``): no
upstream SGLang code in this repository, every line of the port either taken from a source pinned
by sha256 or written here with its reason, and the fetch of those sources (mirrors, the default
URLs, a wrong or unreachable source) failing with the URL and the fix."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest

from operations.sglang_sources import UpstreamSources
from specfleet.core.errors import SpecfleetError
from specfleet.core.sglang.recipe import (
    RecipeError,
    build,
    check_recipe,
    count_taken,
    own_lines,
    used_source_files,
)
from tests.harness.port_build import (
    DATA,
    UNFIXED_COMMIT,
    UNFIXED_DATA,
    load_recipe,
    recipe_reader,
    upstream_runs,
)
from tests.harness.sources import PR20547_DIR, sglang_wheel

ROOT = Path(__file__).resolve().parents[2]
# The files that carry this project's own fixes of #29, each said in provenance.json.
ADAPTATIONS = (
    "sglang/srt/server_args.py",  # --disable-overlap-schedule honoured
    "sglang/srt/speculative/dflash_utils.py",  # 0.5.14's triton verify-mask entry
    "sglang/srt/speculative/dflash_utils_pr20547.py",  # penalties applied in the verify
    "sglang/srt/speculative/dflash_info_v2.py",  # the penalizer fed
)


@pytest.fixture(scope="module")
def recipe() -> dict:
    return load_recipe()


@pytest.mark.local
def test_the_repository_holds_no_upstream_sglang_code():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.split()  # fmt: skip
    found = {}
    for name in files:
        if Path(name).name == "LICENSE":
            continue  # this project's own Apache-2.0 text, not code
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        runs = upstream_runs(text)
        if runs:
            found[name] = runs[:2]
    assert found == {}
    # The check bites: the port's data before #29 carried the PR's code in adaptation.diff.
    old = subprocess.run(["git", "show", f"{UNFIXED_COMMIT}:{UNFIXED_DATA}/adaptation.diff"],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout  # fmt: skip
    assert len(upstream_runs(old)) > 100


def test_the_recipe_holds_and_every_own_line_has_its_reason(recipe):
    assert check_recipe(recipe) == []
    own = own_lines(recipe)
    # The port is upstream's code; what this project wrote is small (#52 added the rank-0
    # broadcast's two lines and a debug hook of nine).
    assert 0 < len(own) <= 90
    assert all(why.strip() and why != "TODO" for _, _, why in own)
    taken = count_taken(recipe)
    assert taken["pr20547-head"] > 900
    # Upstream's later fixes, taken as lines of their releases: 0.5.14's verify-mask entry (#29),
    # stop strings and the KV reservation (#52); 0.5.18's finish order (#52); 0.5.23's
    # verify-mask policy through the wrapping backends (#52).
    assert 0 < taken["sglang-0.5.14"] < 200 and 0 < taken["sglang-0.5.18"] < 100
    assert 0 < taken["sglang-0.5.23"] < 30
    provenance = json.loads((DATA / "provenance.json").read_text())["files"]
    assert [r["file"] for r in provenance] == list(recipe["files"])
    whats = {r["file"]: " ".join(r["what"]) for r in provenance}
    for path in ADAPTATIONS:
        assert "specfleet adaptation (#29)" in whats[path], path


@pytest.mark.local
def test_own_lines_are_not_upstream_code(recipe):
    for path in recipe["files"]:
        text = "\n".join(line for p, line, _ in own_lines(recipe) if p == path)
        assert upstream_runs(text) == [], path


def test_the_defaults_are_the_pr_commit_on_github_and_the_wheels_on_pypi(recipe):
    src = recipe["sources"]
    head = src["pr20547-head"]
    assert head["commit"] == "e67a0d488d905661e621342912874bc7893f1d94"
    assert head["url"].startswith("https://raw.githubusercontent.com/modal-labs/sglang/{commit}/")
    for name in ("sglang-0.5.11", "sglang-0.5.14", "sglang-0.5.18", "sglang-0.5.23"):
        assert src[name]["url"] == "https://files.pythonhosted.org/packages/cp311/s/sglang/{file}"
        wheel = sglang_wheel(src[name]["version"])
        assert wheel.name == src[name]["file"]
    used = used_source_files(recipe)
    assert set(used) == set(src)
    for name, paths in used.items():
        assert paths == set(src[name]["files"]), name  # pins exactly what is read


@pytest.mark.local
def test_a_source_file_that_is_not_the_pinned_one_stops_the_build(recipe):
    read = recipe_reader(recipe)

    def tampered(name: str, path: str):
        text = read(name, path)
        if (name, path) == ("pr20547-head", "sglang/srt/speculative/dflash_worker_v2.py"):
            return text.replace("custom_mask = None", "custom_mask = mask")
        return text

    with pytest.raises(RecipeError, match="dflash_worker_v2.py has sha256 .*, the recipe pins"):
        build(recipe, tampered)
    with pytest.raises(RecipeError, match="has no file"):
        build(recipe, lambda name, path: None)
    bad = copy.deepcopy(recipe)
    bad["files"]["sglang/srt/environ.py"][0]["lines"] = [1, 10**6]
    with pytest.raises(RecipeError, match="lines 1..1000000"):
        build(bad, read)
    bad["files"]["sglang/srt/environ.py"][0] = {"own": ["x = 1"], "why": ""}
    assert "own lines without a why" in " ".join(check_recipe(bad))


# --------------------------------------------------------------------------------------------------
# Fetching the sources
# --------------------------------------------------------------------------------------------------


def test_a_wheel_in_a_mirror_that_fails_its_hash_names_it_and_the_fix(recipe, tmp_path):
    wheel = sglang_wheel("0.5.11")
    data = bytearray(wheel.read_bytes())
    data[-1] ^= 1
    (tmp_path / wheel.name).write_bytes(bytes(data))
    read = UpstreamSources(recipe["sources"], [str(tmp_path)], host="ct200", use_cache=False)
    with pytest.raises(SpecfleetError) as e:
        read("sglang-0.5.11", "sglang/srt/environ.py")
    assert e.value.host == "ct200"
    assert f"{tmp_path / wheel.name} has sha256" in e.value.problem
    assert recipe["sources"]["sglang-0.5.11"]["sha256"] in e.value.problem
    assert f"a folder holding the real {wheel.name}" in e.value.fix


def test_an_unreachable_source_names_the_url_and_the_fix(recipe, tmp_path):
    sources = copy.deepcopy(recipe["sources"])
    sources["sglang-0.5.14"]["url"] = "http://127.0.0.1:9/{file}"  # nothing listens on port 9
    read = UpstreamSources(sources, [str(tmp_path)], host="ct200", use_cache=False)
    with pytest.raises(SpecfleetError) as e:
        read("sglang-0.5.14", "sglang/srt/speculative/dflash_utils.py")
    url = "http://127.0.0.1:9/sglang-0.5.14-cp311-cp311-manylinux_2_34_x86_64.whl"
    assert e.value.problem.startswith(f"cannot fetch {url} (")
    assert "not in patch.source" in e.value.problem and "this project carries none" in e.value.problem
    assert "let the control machine reach 127.0.0.1:9" in e.value.fix
    assert "set patch.source to it" in e.value.fix


def test_pr_head_files_come_from_an_archive_or_a_folder_and_are_checked(recipe, tmp_path):
    path = "sglang/srt/speculative/dflash_info_v2.py"
    from_archive = UpstreamSources(recipe["sources"], [str(PR20547_DIR)], use_cache=False)
    text = from_archive("pr20547-head", path)
    assert text is not None and "class DFlashDraftInputV2" in text
    folder = tmp_path / "python" / Path(path).parent
    folder.mkdir(parents=True)
    (folder / Path(path).name).write_text(text)
    assert UpstreamSources(recipe["sources"], [str(tmp_path)], use_cache=False)(
        "pr20547-head", path) == text  # fmt: skip
    (folder / Path(path).name).write_text(text + "# edited\n")
    with pytest.raises(SpecfleetError, match="the port's recipe pins"):
        UpstreamSources(recipe["sources"], [str(tmp_path)], use_cache=False)("pr20547-head", path)


@pytest.mark.local
def test_a_download_is_cached_by_its_sha256_and_checked_again(recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    wheel = sglang_wheel("0.5.14")
    sources = copy.deepcopy(recipe["sources"])
    sources["sglang-0.5.14"]["url"] = wheel.parent.as_uri() + "/{file}"  # file:// as a download
    read = UpstreamSources(sources, [], use_cache=True)
    assert "TritonAttnBackend" in read("sglang-0.5.14", "sglang/srt/speculative/dflash_utils.py")
    cached = tmp_path / "cache" / "specfleet" / "upstream" / sources["sglang-0.5.14"]["sha256"]
    assert cached.read_bytes() == wheel.read_bytes()
    # Offline now: the cached copy is used.
    sources["sglang-0.5.14"]["url"] = "http://127.0.0.1:9/{file}"
    again = UpstreamSources(sources, [], use_cache=True)
    assert again("sglang-0.5.14", "sglang/srt/environ.py") is not None
    # A damaged cached copy is not used: it is fetched again (and here, cannot be).
    cached.write_bytes(b"damaged")
    with pytest.raises(SpecfleetError, match="cannot fetch http://127.0.0.1:9/"):
        UpstreamSources(sources, [], use_cache=True)("sglang-0.5.14", "sglang/srt/environ.py")
