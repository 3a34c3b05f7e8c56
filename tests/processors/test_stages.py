"""The stages of `processors/` import one way (docs/ARCHITECTURE.md, "Constrained decoding"):

    processors (base, json_schema, regex, choice, grammar_lark) -> schema, lark, index, automaton
    schema, lark -> automaton          index -> automaton          automaton -> (leaves only)

`budget` and `jit` are leaves every stage may import. Read from the source like `tests/test_architecture.py`
(function-level imports too), counting imports of a stage's face (`hf_paged.processors.index`) as edges to the
stage, which the cycle test leaves out.
"""

from __future__ import annotations

from tests.test_architecture import _graph

STAGES = ("automaton", "index", "schema", "lark")
LEAVES = {"budget", "jit"}
ALLOWED = {
    "automaton": set(),
    "index": {"automaton"},
    "schema": {"automaton"},
    "lark": {"automaton"},
    "processors": {"automaton", "index", "schema", "lark"},
}
PREFIX = "hf_paged.processors"


def _stage(module: str) -> str | None:
    """The stage of a processors module: its subpackage, "processors" for the top-level processors, None for the
    leaves and the package itself."""
    parts = module.split(".")
    if len(parts) < 3:
        return None
    if parts[2] in STAGES:
        return parts[2]
    return None if parts[2] in LEAVES else "processors"


def test_stages_import_one_way():
    bad = []
    for module, deps in _graph().items():
        if not module.startswith(PREFIX + "."):
            continue
        stage = _stage(module)
        if stage is None:
            if module.split(".")[2] in LEAVES:  # leaves import no stage
                bad += [f"{module} imports {d}" for d in deps if d.startswith(PREFIX) and _stage(d) is not None]
            continue
        for dep in deps:
            target = _stage(dep) if dep.startswith(PREFIX + ".") else None
            if target is not None and target != stage and target not in ALLOWED[stage]:
                bad.append(f"{module} imports {dep} ({stage} -> {target})")
    assert not bad, "imports against the stage order:\n" + "\n".join(sorted(bad))


def test_faces_export_what_they_name():
    """Each stage's face lists only names it has (a lazy face resolves each one)."""
    import importlib

    for stage in STAGES:
        face = importlib.import_module(f"{PREFIX}.{stage}")
        missing = [name for name in face.__all__ if not hasattr(face, name)]
        assert not missing, f"{stage} face: {missing}"
