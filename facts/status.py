"""Facts the read-only status view asks: is the SGLang server answering, and with what model."""

from __future__ import annotations

import json
import shlex
from typing import Any

from pyinfra.api import FactBase
from typing_extensions import override

from specfleet.core.resources import hostside_path

_CODE = "##specfleet-health="
_INFO = "##specfleet-model-info="
_HELD = "##specfleet-port-held="
# The one check of who listens on the server's port (run by the host's python3, stdlib only).
PORT_OWNER = hostside_path("port_owner.py")


def parse_health(output: list[str]) -> dict[str, Any]:
    """Parse the Health command's output: the HTTP status of /health_generate and the JSON of
    /get_model_info (each on a marker line; ``000`` is curl's "no answer")."""
    value: dict[str, Any] = {"health_code": None, "model_path": None, "model_info": None,
                             "port_held": None}
    for line in output:
        if line.startswith(_HELD):
            value["port_held"] = line[len(_HELD):].strip() or "a process outside the unit"
        elif line.startswith(_CODE):
            code = line[len(_CODE) :].strip()
            value["health_code"] = int(code) if code.isdigit() and code != "000" else None
        elif line.startswith(_INFO):
            text = line[len(_INFO) :].strip()
            try:
                info = json.loads(text) if text else None
            except ValueError:
                info = None
            if isinstance(info, dict):
                value["model_info"] = info
                value["model_path"] = info.get("model_path")
    return value


class Health(FactBase[dict[str, Any]]):
    """
    One probe of the SGLang server from the host itself: the HTTP status of ``/health_generate``
    (``None``: nothing answered) and the ``model_path`` that ``/get_model_info`` reports. With
    ``secret_file`` (the unit's ``--config`` YAML), the API key is read from it on the host and
    sent as a bearer token through curl's stdin, so it is in no argv, and only when every
    listener on the port is a process of ``unit`` (``specfleet/hostside/port_owner.py``):
    otherwise nothing is sent and ``port_held`` says who listens.

    .. code:: python

        {"health_code": 200, "model_path": "/srv/models/moonshotai--Kimi-K2.6",
         "model_info": {"model_path": "...", "is_generation": True, ...}}
    """

    @override
    def requires_command(self, *args, **kwargs) -> str:
        return "curl"

    @staticmethod
    def default() -> dict[str, Any]:
        return {"health_code": None, "model_path": None, "model_info": None, "port_held": None}

    @override
    def command(self, host: str, port: int, secret_file: str | None = None,
                timeout_s: float = 10, unit: str | None = None) -> str:
        base = f"http://{host}:{int(port)}" if ":" not in host else f"http://[{host}]:{int(port)}"
        headers = "printf ''"
        if secret_file:
            key = (f"sed -n 's/^api-key: *\"\\{{0,1\\}}\\([^\"]*\\)\"\\{{0,1\\}} *$/\\1/p' "
                   f"{shlex.quote(secret_file)} 2>/dev/null")
            headers = f'printf "Authorization: Bearer %s\\n" "$({key})"'
        curl = f"curl -s --max-time {float(timeout_s):g} -H @-"
        ask = (
            f"echo '{_CODE}'\"$({headers} | {curl} -o /dev/null -w '%{{http_code}}' "
            f"{shlex.quote(base + '/health_generate')})\"; "
            f"echo '{_INFO}'\"$({headers} | {curl} {shlex.quote(base + '/get_model_info')} "
            "| tr -d '\\n')\""
        )
        if not (secret_file and unit):
            return ask
        # The key only to the unit's own process: exit 0, the unit's alone; 3, nothing listens
        # (nothing to ask); otherwise who holds the port, and nothing is sent.
        guard = (f"python3 -I -c {shlex.quote(PORT_OWNER.read_text())} {int(port)} "
                 f"{shlex.quote(unit)}")
        return (f"held=$({guard} 2>&1); rc=$?; if [ $rc -eq 0 ]; then {ask}; "
                f"elif [ $rc -ne 3 ]; then echo '{_HELD}'\"$(printf %s \"$held\" | tr -d "
                "'\\n')\"; fi")

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_health(output)
