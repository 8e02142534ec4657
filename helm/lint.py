"""Lints the warmstore chart with Helm's own linter (the helm-sdkpy package), once with the default
values and once with ci/all-options-values.yaml in their place. Exits 1 on any error."""
import asyncio
import json
import pathlib
import shutil
import sys
import tempfile

import helm_sdkpy

chart = pathlib.Path(__file__).resolve().parent / "warmstore"


def lint(path):
    result = asyncio.run(helm_sdkpy.Lint(helm_sdkpy.Configuration()).run(str(path)))
    # Helm's severities: 1 info, 2 warning, 3 error.
    messages = result.get("Messages") or []
    print(json.dumps(result))
    return [m for m in messages if m.get("Severity", 0) >= 3] + list(result.get("Errors") or [])


failures = []
failures += lint(chart)
with tempfile.TemporaryDirectory() as tmp:
    copy = pathlib.Path(tmp) / "warmstore"
    shutil.copytree(chart, copy)
    shutil.copy(chart / "ci" / "all-options-values.yaml", copy / "values.yaml")
    failures += lint(copy)
if failures:
    print("helm lint errors:", failures, file=sys.stderr)
    sys.exit(1)
print("helm lint: no errors with default values and with all options on")
