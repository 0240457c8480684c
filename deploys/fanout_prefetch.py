"""The rollout's prefetch stage with fan-out (run by ``specfleet.fleet.fanout.run_prefetch``, which
passes this run's plan and keys in ``SPECFLEET_FANOUT_PLAN``; see specfleet/fleet/fanout.py).

1. the weights tools and the token on every host; each seed starts its upstream download at
   once (detached; the fleet's other preparations are off the download's critical path);
2. the fan-out agent, and an ephemeral sshd on each host that serves peers;
3. per model: the seed downloads from upstream while its peers copy from it, pipelined and in
   a tree (one operation, so all hosts run it at once), then ``weights.model`` on every host
   verifies, fetches from upstream whatever the peers could not give, writes the manifest;
4. the sshd units stop; keys, known_hosts and jobs are removed.
"""

from pyinfra import host

from operations import fanout, preflight, weights
from operations.pyinfra_speedups import install as install_speedups
from specfleet.core.fanout import MODELS
from specfleet.core.settings import settings_for_host

install_speedups()  # pyinfra's per-operation costs, where its version is the one they fit

settings = settings_for_host(host)
plan = fanout.load_plan()
me = plan["hosts"][host.name]
serving = bool(me["receivers"])

preflight.lock(name="Hold the run lock", settings=settings, probe=False)
weights.tools_from_settings(settings)
weights.token_from_settings(settings)
for which in MODELS:
    # On every host (pyinfra lines operations up by the order each host calls them): a seed
    # starts its download now, its fanout.model below attaches to it; a peer does nothing yet.
    fanout.model(name=f"{which.capitalize()} download started (seeds)", settings=settings,
                 which=which,
                 role=me["models"][which]["role"], wait=False)
fanout.agent(name="Fan-out agent")
fanout.needs(name="Weights wanted here", settings=settings, rollout_id=plan["rollout_id"])
fanout.serve(
    name="Serve weights to peers (ephemeral sshd)",
    # Only when a host it serves wants a copy (a converged fleet starts no sshd).
    _if=lambda rid=plan["rollout_id"], peers=tuple(me["receiver_hosts"]): fanout.wants_weights(
        rid, list(peers)
    ),
    present=serving,
    rollout_id=plan["rollout_id"],
    port=plan["port"],
    public_key=plan["public_key"] if serving else None,
    host_private_key=me.get("host_private_key"),
    receivers=me["receivers"],
    address=me["address"],
    models_root=settings.models_root,
    state_dir=settings.state_dir,
    # Only the revision folders of the models this host serves in this fan-out.
    models=fanout.served_models(settings, me.get("serves", ())) if serving else None,
    max_seconds=int(settings.rollout.fanout_serve_hours * 3600),
)
for which in MODELS:
    role = me["models"][which]
    fanout.model(
        name=f"{which.capitalize()} weights from upstream (seed) or peers",
        settings=settings,
        which=which,
        role=role["role"],
        rollout_id=plan["rollout_id"],
        sources=role["sources"],
        port=plan["port"],
        private_key=plan["private_key"] if role["role"] == "peer" else None,
        servers=plan["servers"],
    )
    weights.model(name=f"{which.capitalize()} weights verified", settings=settings, which=which)
fanout.serve(name="Stop serving weights", present=False, state_dir=settings.state_dir)
fanout.cleanup(name="Remove fan-out keys and jobs", state_dir=settings.state_dir)
preflight.lock(name="Release the run lock", settings=settings, present=False)
