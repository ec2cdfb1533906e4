"""The --json shapes docs/CLI.md documents (between its json-shapes markers), and a check of a
command's output against one of them. Used by the unit test sdk and the e2e module sdk."""
import json
import re

TYPES = {"string": str, "integer": int, "boolean": bool, "array": list, "object": dict,
         "null": type(None)}


def load(path):
    with open(path) as f:
        text = f.read()
    m = re.search(r"<!-- json-shapes:begin -->\n```json\n(.*?)```\n<!-- json-shapes:end -->",
                  text, re.S)
    if not m:
        raise ValueError(f"{path}: no json-shapes block")
    return json.loads(m.group(1))


def problems(shapes, name, value, where="$"):
    """What in VALUE does not fit shape NAME (an empty list when it fits)."""
    shape = shapes[name]
    if not isinstance(value, dict):
        return [f"{where}: not an object"]
    out = []
    keys = {k.rstrip("?"): (t, k.endswith("?")) for k, t in shape.items()}
    for k, (t, optional) in keys.items():
        if k not in value:
            if not optional:
                out.append(f"{where}.{k}: missing")
            continue
        v = value[k]
        alts = t.split("|")
        ok = False
        for a in alts:
            if a.endswith("[]") and a[:-2] in shapes:
                ok = ok or (isinstance(v, list) and not any(
                    problems(shapes, a[:-2], item, f"{where}.{k}[{i}]")
                    for i, item in enumerate(v)))
            elif a in shapes:
                ok = ok or not problems(shapes, a, v, f"{where}.{k}")
            elif a == "integer":
                ok = ok or (isinstance(v, int) and not isinstance(v, bool))
            else:
                ok = ok or isinstance(v, TYPES[a])
        if not ok:
            out.append(f"{where}.{k}: {json.dumps(v)[:80]} is not {t}")
    for k in value:
        if k not in keys:
            out.append(f"{where}.{k}: not documented")
    return out
