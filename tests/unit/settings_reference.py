"""docs/settings.md's settings reference, written from the models' JSON schema (every key, its type and
default) and each field's docstring (read from the source: pydantic's own reading of them costs
every run ~25 ms at import). ``python -m tests.unit.settings_reference docs/settings.md`` rewrites it;
``tests/unit/test_settings.py`` fails when that page and the models differ."""

from __future__ import annotations

import ast
import functools
import inspect
import json
import sys
from pathlib import Path
from typing import Any

from specfleet.core.settings import schema
from specfleet.core.settings.schema import Settings

BEGIN = "<!-- settings reference: python -m tests.unit.settings_reference docs/settings.md -->"
END = "<!-- end of the settings reference -->"


def _type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "anyOf" in prop:
        return " or ".join(_type(p, defs) for p in prop["anyOf"])
    if "enum" in prop or "const" in prop:
        return " or ".join(f"`{json.dumps(v)}`" for v in prop.get("enum", [prop.get("const")]))
    if "$ref" in prop:
        return "section"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}), defs)}"
    if kind == "object":
        return f"map of {_type(prop.get('additionalProperties', {}), defs)}"
    return kind


@functools.cache
def docstrings() -> dict[tuple[str, str], str]:
    """{(class, field): the docstring under the field} of the schema's source."""
    docs = {}
    for cls in ast.parse(inspect.getsource(schema)).body:
        body = getattr(cls, "body", [])
        for field, doc in zip(body, body[1:], strict=False):
            if (isinstance(field, ast.AnnAssign) and isinstance(doc, ast.Expr)
                    and isinstance(doc.value, ast.Constant)):
                docs[(cls.name, field.target.id)] = " ".join(doc.value.value.split())
    return docs


def _rows(model: dict[str, Any], defs: dict[str, Any], prefix: str,
          defaults: dict[str, Any]) -> list[str]:  # fmt: skip
    """A row per key of ``model``; ``defaults``: the section's own default, where it has one."""
    rows = []
    for name, prop in model["properties"].items():
        refs = [p["$ref"] for p in [prop, *prop.get("anyOf", [])] if "$ref" in p]
        if refs:
            rows += _rows(defs[refs[0].rsplit("/", 1)[1]], defs, f"{prefix}{name}.",
                          prop.get("default") or {})  # fmt: skip
            continue
        if name in defaults:
            default = f"`{json.dumps(defaults[name])}`"
        elif name in model.get("required", ()):
            default = "required"
        else:
            default = f"`{json.dumps(prop.get('default'))}`"
        doc = docstrings().get((model["title"], name), "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name}` | {_type(prop, defs)} | {default} | {doc} |")
    return rows


def reference() -> str:
    schema = Settings.model_json_schema()
    lines = ["| key | type | default | what |", "|---|---|---|---|"]
    return "\n".join([BEGIN, *lines, *_rows(schema, schema.get("$defs", {}), "", {}), END])


def rewrite(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + reference() + tail


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/settings.md")
    path.write_text(rewrite(path.read_text()))
