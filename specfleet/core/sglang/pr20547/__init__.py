"""The port of PR#20547 (SGLang's DFlash v2 overlap worker) onto released SGLang wheels, gathered
so that removing the port is one step.

- ``decision``: the decision table (built in, apply the port, keep v1) and ``PortVerdict``;
- ``port``: the port's data (``specfleet/patchdata/pr20547/``) and its PR diff's hunks;
- ``portdata``: ``Port`` (the one diff it applies) and the verdict on a host's tree.
"""
