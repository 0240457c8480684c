"""The port of PR#20547 (SGLang's DFlash v2 overlap worker) onto released SGLang wheels: every
pure piece of it, gathered so that removing the port is one step (``docs/port.md``, "Removing the
port").

- ``decision``: the decision table (built in, apply the port, keep v1) and ``PortVerdict``;
- ``port``: the port's data (``specfleet/patchdata/pr20547/``) and its PR diff's hunks;
- ``portdata``: ``Port`` (the one diff it applies) and the verdict on a host's tree.

The operation is ``operations.pr20547``. Shared with the drafter RoPE patch, and staying:
``specfleet.core.sglang.patch`` (the diff filter), ``.recipe`` (recipes of pinned sources) and
``.rope``.
"""
