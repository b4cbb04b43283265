"""The documentation site's pages (``docs/``, built by ``mkdocs build --strict``) hold what they
promise: every code block runs, every result has its command, and every section the README had
before it became a front page has a page.

A fenced block is run by its language: ``python`` blocks of one page run in order in one
namespace (as a reader pastes them into one session), from the repository root; ``sh`` blocks
run in bash there, with this environment's ``bin/`` first on ``PATH``. ``text``, ``toml`` and
``mermaid`` blocks are shown (output, a machine file, a diagram), never run. A block that
cannot run in a test (an install, minutes of training, a job under ``mpiexec``) says so on the
line before it, with the reason and what covers it instead::

    <!-- not run: trains under MPI for minutes; tests/e2e run the recipes under mpiexec -->

and a block that runs but takes long is ``<!-- slow: why -->`` (its page's test is marked
``slow``). A block without a language, or in another one, fails the test: nothing slips through
unlabelled.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RUN = {"python", "sh"}
SHOWN = {"text", "toml", "mermaid"}
FENCE = re.compile(r"^(?:<!-- (not run|slow): (.+?) -->\n)?```(\S*)\n(.*?)^```[ \t]*$",
                   re.M | re.S)

# Each section of the README before it became a front page (issue 40), and the page that holds
# it now, under the same heading.
OLD_README = {
    "meta": "guide/levels.md#The levels",
    "Quick start": "guide/quickstart.md",
    "Recipes shipped": "guide/recipes.md",
    "Language models": "guide/language_models.md",
    "Crashes and resuming": "guide/fault_tolerance.md",
    "Runs that survive": "guide/fault_tolerance.md",
    "Data": "guide/quickstart.md",
    "Threads under MPI": "guide/quickstart.md",
    "Writing a recipe": "guide/recipes.md",
    "Bringing your own": "guide/recipes.md",
    "Writing a model": "guide/models.md",
    "Writing an optimizer": "guide/optimizers.md",
    "Distributed strategies": "guide/strategies.md",
    "Pipeline parallelism": "guide/strategies.md",
    "Partitioned layers": "guide/strategies.md",
    "Hybrids: data parallelism over model-parallel replicas": "guide/strategies.md",
    "Comparing strategies: N-way reports": "guide/comparing_strategies.md",
    "Planning: which strategy at P ranks (`meta plan`)": "guide/planner.md",
    "The seeds' communication catalogue: quantization, batch growth, hierarchy, neighbours, "
    "Hogwild": "guide/comparing_strategies.md",
    "Sandblaster L-BFGS": "guide/strategies.md",
    "Asynchronous DBN pre-training": "guide/strategies.md",
    "Bringing a network: parameters, state and constants": "guide/models.md",
    "The models users bring: ONNX coverage": "guide/onnx.md",
    "Registering a custom operator in Python": "guide/operators_python.md",
    "Other frameworks in meta's levels: PyTorch and onnxruntime": "guide/pytorch.md",
    "Cross-framework report: LeNet-5 on meta, PyTorch and onnxruntime": "guide/pytorch.md",
    "The planned executor: the graph compiled onto oneDNN": "guide/planned_executor.md",
    "The native path: C++ kernels and the native executor": "guide/operators_cpp.md",
    "Registering a custom operator in C++": "guide/operators_cpp.md",
    "Tests and benchmarks": "guide/benchmarking.md",
    "Benchmark reports": "guide/benchmarking.md",
    "Layout": "guide/layout.md",
    "Dependencies": "guide/dependencies.md",
}


@dataclass
class Block:
    page: Path
    line: int
    language: str
    code: str
    mark: str | None  # "not run", "slow" or None
    reason: str | None

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    return [Block(page, text.count("\n", 0, m.start(3) if m.group(1) is None else m.start()) + 1,
                  m.group(3), m.group(4), m.group(1), m.group(2))
            for m in FENCE.finditer(text)]


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.language in RUN and b.mark != "not run"]


def _page_params():
    params = []
    for page in pages():
        todo = runnable(page)
        if todo:
            slow = any(b.mark == "slow" for b in todo)
            params.append(pytest.param(page, id=str(page.relative_to(DOCS)),
                                       marks=[pytest.mark.slow] if slow else []))
    return params


def test_every_block_is_labelled() -> None:
    problems = []
    for page in pages():
        for b in blocks(page):
            if b.language not in RUN | SHOWN:
                problems.append(f"{b.where()}: a ```{b.language or '(no language)'} block; "
                                f"give one of {sorted(RUN | SHOWN)}")
            elif b.mark and b.language in SHOWN:
                problems.append(f"{b.where()}: '{b.mark}' on a {b.language} block, never run")
    assert not problems, "\n".join(problems)
    assert sum(len(runnable(p)) for p in pages()) >= 7


def test_fences_are_balanced() -> None:
    """An unclosed fence would swallow the rest of a page (and its blocks) silently."""
    for page in pages():
        fences = [ln for ln in page.read_text().split("\n") if ln.startswith("```")]
        assert len(fences) % 2 == 0, f"{page.relative_to(ROOT)}: an unclosed ``` fence"
        assert len(fences) == 2 * len(blocks(page)), f"{page.relative_to(ROOT)}: a fence the " \
            "test cannot read (a language with spaces, text after the closing fence?)"


@pytest.mark.parametrize("page", _page_params())
def test_page_blocks_run(page: Path, tmp_path, monkeypatch) -> None:
    from meta.lv0 import registry
    from meta.lv1 import MODELS
    from meta.lv2.optimizers import OPTIMIZERS

    monkeypatch.setenv("META_CACHE_DIR", str(tmp_path))  # C++ operators compile here
    monkeypatch.chdir(ROOT)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    saved, models = dict(OPTIMIZERS.entries), dict(MODELS.entries)
    namespace: dict = {"__name__": "__docs__"}
    try:  # the examples register operators, optimizers, models: keep the registries clean
        with registry.scratch():
            for b in runnable(page):
                if b.language == "python":
                    exec(compile(b.code, b.where(), "exec"), namespace)
                else:
                    done = subprocess.run(["bash", "-euo", "pipefail", "-c", b.code], cwd=ROOT,
                                          env=env, capture_output=True, text=True,
                                          timeout=300)
                    assert done.returncode == 0, \
                        f"{b.where()}: exit {done.returncode}\n{done.stderr[-2000:]}"
    finally:
        OPTIMIZERS.entries.clear()
        OPTIMIZERS.entries.update(saved)
        MODELS.entries.clear()
        MODELS.entries.update(models)


def test_blocks_not_run_say_why() -> None:
    for page in pages():
        for b in blocks(page):
            if b.mark:
                assert len(b.reason.strip()) > 10, f"{b.where()}: say why it is '{b.mark}'"


def _headings(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)]


def test_old_readme_sections_have_a_page() -> None:
    """Nothing of the 1,508-line README was lost when it became a front page."""
    for heading, where in OLD_README.items():
        path, _, renamed = where.partition("#")
        page = DOCS / path
        assert page.exists(), f"README section '{heading}': {path} does not exist"
        assert (renamed or heading) in _headings(page), \
            f"README section '{heading}': no such heading in docs/{path}"


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [str(p.relative_to(DOCS)) for p in pages()
               if p.relative_to(DOCS).as_posix() not in nav]
    assert not missing, f"pages missing from mkdocs.yml's nav: {missing}"


def test_every_result_has_its_command_date_and_machine() -> None:
    """docs/results/index.md lists each file a benchmark wrote, in a row with a command (a
    code span), a date and a machine."""
    index = (DOCS / "results" / "index.md").read_text()
    rows = [ln for ln in index.split("\n") if ln.startswith("| [")]
    for path in sorted((DOCS / "results").iterdir()):
        if path.name == "index.md":
            continue
        row = next((r for r in rows if f"]({path.name})" in r), None)
        assert row, f"docs/results/{path.name} is not listed in docs/results/index.md"
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 5 and "`" in cells[2], f"{path.name}: no command in {row}"
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", cells[3]), f"{path.name}: no date in {row}"
        assert cells[4], f"{path.name}: no machine in {row}"


def test_scripts_write_into_docs_folders() -> None:
    """No script reads or writes a file in docs/ itself any more: a benchmark's figures belong
    in docs/results/, a generated page in docs/reference/."""
    flat = re.compile(r'docs/[\w.]+\.(md|json|png|toml)\b|"docs"\s*/\s*"[\w.]+\.\w+"')
    for folder in ("benchmarks", "tools", "meta", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text().split("\n"), 1):
                assert not flat.search(line), f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
