"""The fan-out against a hostile peer (issue #32, #33): a source that sends a second, altered copy
of a file it was asked for once, a source's strings with control characters, a receiver's request
with a NUL byte or nested past the parser, a folder swapped for a symlink between the serving
side's check and its open, and the fast check of a file put in place of a verified one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specfleet.hostside import fanout_agent, weights_agent
from tests.unit.test_fanout import (
    REV,
    SOURCE,
    channel_answers,
    receiver_pull,
    source_channel,
    stream,
)

GOOD, EVIL = b"print('the real modeling code')\n", b"import os;os.system('id>/tmp/')\n"


def stand_in_source(monkeypatch, answers: bytes, status: dict | None = None) -> None:
    """A stand-in source (no sshd here): a status line, then, once asked, ``answers`` verbatim,
    then it stays on the line a while (as a source whose stream is still open does)."""
    real_popen = subprocess.Popen
    line = json.dumps(status or {"verified": {}})
    script = ("import sys, time; sys.stdout.buffer.write(sys.argv[1].encode() + b'\\n'); "
              "sys.stdout.flush(); sys.stdin.readline(); "
              "sys.stdout.buffer.write(bytes.fromhex(sys.argv[2])); sys.stdout.flush(); "
              "time.sleep(2)")
    monkeypatch.setattr(fanout_agent.subprocess, "Popen", lambda argv, **kw: real_popen(
        [sys.executable, "-c", script, line, answers.hex()], **kw))


def header(path, **fields) -> bytes:
    return (json.dumps({"file": path, **fields}) + "\n").encode()


def verified_lines(rev_dir: Path) -> list[dict]:
    path = rev_dir / ".specfleet" / "verified.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.local
def test_a_second_altered_copy_is_refused_and_what_is_recorded_is_what_was_hashed(
        tmp_path, monkeypatch):
    """The source sends the file asked for, then a second copy of the same size with other
    bytes: the second is refused (nothing was asked for it), the source is given up, the file
    in place holds the bytes that were hashed, and its record (size, mtime, inode) is that
    file's: the fast check trusts it, and would not trust a file put in its place."""
    assert len(GOOD) == len(EVIL)
    _, rev_dir, pull = receiver_pull(tmp_path)
    f = {"path": "modeling_x.py", "size": len(GOOD), "blob_id": weights_agent.git_blob_id(GOOD)}
    stand_in_source(monkeypatch, header("modeling_x.py", size=len(GOOD)) + GOOD
                    + header("modeling_x.py", size=len(EVIL)) + EVIL)
    wanted = {"modeling_x.py": f}
    with source_channel(pull, rev_dir, 10) as (channel, _):
        got, failed, broke = pull.copy(channel, SOURCE, ["modeling_x.py"], str(rev_dir),
                                       wanted, 10)
        # Whatever the reading thread did with the second copy, it is done once it ended.
        assert channel.latest(10) is None
    assert (rev_dir / "modeling_x.py").read_bytes() == GOOD
    assert (got, failed, wanted) == (1, [], {})
    assert [p.name for p in rev_dir.iterdir() if p.name.endswith(fanout_agent.PART_SUFFIX)] == []
    (entry,) = verified_lines(rev_dir)
    st = (rev_dir / "modeling_x.py").stat()
    assert (entry["size"], entry["mtime_ns"], entry["ino"]) == (st.st_size, st.st_mtime_ns,
                                                                 st.st_ino)
    assert entry["hash"] == f["blob_id"] and weights_agent.still_matches(str(rev_dir), entry)
    # Another file put in its place, with the same size and mtime: not the file verified.
    other = rev_dir / "other"
    other.write_bytes(EVIL)
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, rev_dir / "modeling_x.py")
    assert not weights_agent.still_matches(str(rev_dir), entry)
    assert "not asked for" in channel.hostile


@pytest.mark.local
def test_the_second_copy_gives_the_file_to_the_next_source(tmp_path, monkeypatch):
    """Asked for two files, the source answers the first twice: the second answer is refused,
    the first is kept (it was hashed), and the file not given stays wanted (the next source or
    upstream gets it); the run notes why, once."""
    _, rev_dir, pull = receiver_pull(tmp_path)
    a = {"path": "a.py", "size": len(GOOD), "blob_id": weights_agent.git_blob_id(GOOD)}
    b = {"path": "b.py", "size": 3, "blob_id": weights_agent.git_blob_id(b"abc")}
    stand_in_source(monkeypatch, header("a.py", size=len(GOOD)) + GOOD
                    + header("a.py", size=len(EVIL)) + EVIL + header("b.py", size=3) + b"abc")
    wanted = {"a.py": a, "b.py": b}
    with source_channel(pull, rev_dir, 10) as (channel, _):
        got, failed, broke = pull.copy(channel, SOURCE, ["a.py", "b.py"], str(rev_dir),
                                       wanted, 10)
    assert got == 1 and "not asked for" in broke and list(wanted) == ["b.py"]
    assert (rev_dir / "a.py").read_bytes() == GOOD and not (rev_dir / "b.py").exists()
    assert [e["path"] for e in verified_lines(rev_dir)] == ["a.py"]


@pytest.mark.local
def test_bytes_that_do_not_match_never_reach_the_path(tmp_path, monkeypatch):
    """A copy with other bytes than the Hub's is checked before it is renamed: the path never
    holds it, nothing is recorded, the file is left for upstream."""
    _, rev_dir, pull = receiver_pull(tmp_path)
    (rev_dir / "modeling_x.py").write_bytes(b"")  # an earlier, partial file stays as it was
    f = {"path": "modeling_x.py", "size": len(GOOD), "blob_id": weights_agent.git_blob_id(GOOD)}
    stand_in_source(monkeypatch, header("modeling_x.py", size=len(EVIL)) + EVIL)
    wanted = {"modeling_x.py": f}
    with source_channel(pull, rev_dir, 10) as (channel, _):
        got, failed, broke = pull.copy(channel, SOURCE, ["modeling_x.py"], str(rev_dir),
                                       wanted, 10)
    assert (got, failed, broke, wanted) == (0, [], "", {})
    assert pull.data["corrupt"] == ["modeling_x.py"]
    assert (rev_dir / "modeling_x.py").read_bytes() == b"" and verified_lines(rev_dir) == []
    assert sorted(p.name for p in rev_dir.iterdir()) == [".specfleet", "modeling_x.py"]


@pytest.mark.local
def test_a_sources_strings_are_shown_with_control_characters_escaped(tmp_path, monkeypatch,
                                                                      capsys):
    """A source's error text and an unasked file name go to the journal and the progress: a
    terminal escape or a newline (a forged journal line) is shown escaped."""
    _, rev_dir, pull = receiver_pull(tmp_path)
    f = {"path": "a.py", "size": 3, "blob_id": "x"}
    stand_in_source(monkeypatch, header("a.py", error="\x1b[2J\nDone: all verified\r")
                    + header("\x1b]0;pwned\x07x\u2028", size=0))
    with source_channel(pull, rev_dir, 10) as (channel, _):
        pull.copy(channel, SOURCE, ["a.py"], str(rev_dir), {"a.py": f}, 10)
        channel.next_file(5)
    out = capsys.readouterr().out
    notes = " ".join(e["text"] for e in pull.data["events"])
    for text in (out.rstrip("\n"), notes):
        assert not any(c in text for c in "\x1b\r\x07\u2028"), repr(text)
    assert "\\x1b[2J\\nDone: all verified\\r" in notes
    assert fanout_agent.shown("\x1b]0;pwned\x07x\u2028") == "\\x1b]0;pwned\\x07x\\u2028"
    assert fanout_agent.shown(["a"]) == "['a']" and fanout_agent.shown("é.py") == "é.py"
    assert len(fanout_agent.shown("x" * 5000)) == fanout_agent.SHOWN_MAX + 3


@pytest.mark.local
def test_a_request_with_a_nul_byte_or_nested_deep_is_refused_not_a_crash(tmp_path):
    """The forced command, run for real: a path with a NUL byte and a request nested past the
    JSON parser's depth each get an error answer; the stream goes on and serves the next."""
    from tests.unit.test_fanout import models_tree

    models = models_tree(tmp_path)
    rc, answers, err = stream(models, tmp_path, {"send": ["config.json\x00x"]},
                              b"[" * 200_000 + b"\n", {"send": ["con\nfig.json"]},
                              {"send": ["config.json"]})
    assert rc == 0 and "Traceback" not in err, err
    files = [a for a in answers if isinstance(a, tuple)]
    assert [h.get("error", "") != "" for h, _ in files] == [True, True, True, False], files
    assert "control character" in files[0][0]["error"]
    assert files[-1] == ({"file": "config.json", "size": 2}, b"{}")


def test_a_folder_swapped_for_a_symlink_after_the_check_is_not_followed(tmp_path, monkeypatch):
    """Someone with write access to the revision folder swaps a folder for a symlink out of it
    between the serving side's check (no symlink out) and its open: the open walks each
    component without following a link, and sends nothing of the target."""
    models = tmp_path / "models"
    rev = models / "o--m" / REV
    (rev / "sub").mkdir(parents=True)
    (rev / "sub" / "t.json").write_text("served")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "t.json").write_text("secret-bytes")
    real_check = fanout_agent.symlink_out

    def check_then_swap(folder):
        found = real_check(folder)  # clean when checked...
        os.rename(rev / "sub", rev / "sub-old")
        os.symlink(secret, rev / "sub")  # ...swapped right after
        return found

    monkeypatch.setattr(fanout_agent, "symlink_out", check_then_swap)
    out = os.open(tmp_path / "answers", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    channel = fanout_agent.ServeChannel(inp=-1, out=out)
    send = fanout_agent.request_sender(str(rev), "o--m", REV, {"o--m": REV}, {}, channel)
    try:
        assert send({"send": ["sub/t.json"]}) is True
    finally:
        os.close(out)
    got = (tmp_path / "answers").read_bytes()
    assert b"secret" not in got
    ((head, data),) = channel_answers(got)
    assert head["file"] == "sub/t.json" and "error" in head and data is None, head


@pytest.mark.local
def test_the_weights_fact_sees_a_replaced_file_as_changed(tmp_path):
    """The host's weights fact (what `weights.model` decides a no-op on) reads the manifest's
    inode too: a file put in place of a verified one is changed, same size and mtime or not."""
    script = Path(fanout_agent.__file__).parent / "facts" / "weights_state.py"
    rev = tmp_path / REV
    (rev / ".specfleet").mkdir(parents=True)
    (rev / "a.py").write_bytes(GOOD)
    st = (rev / "a.py").stat()
    (rev / ".specfleet" / "manifest.json").write_text(json.dumps({
        "revision": REV, "complete": True, "bytes": len(GOOD), "files": {"a.py": {
            "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}}}))

    def changed() -> list:
        out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                             text=True, check=True).stdout
        return json.loads(out)["revisions"][REV]["changed"]

    assert changed() == []
    (rev / "b").write_bytes(EVIL)
    os.utime(rev / "b", ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(rev / "b", rev / "a.py")
    assert changed() == ["a.py"]

