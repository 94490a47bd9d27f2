""".dockerignore against what the README's two commands make: every path `bash scripts/sim.sh` and
`bash scripts/test.sh` create in the tree (virtual environments, caches, output, generated code)
stays out of the image build's context, and nothing the repository tracks does. The paths are
read from the scripts, pyproject.toml and the code that writes them, not listed here, so that a
new environment or output folder fails this test rather than ships 3 GB in every image. No
Docker needed: the patterns are matched as the engine matches them (moby's patternmatcher)."""
from __future__ import annotations

import posixpath
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pattern_regex(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as the engine compiles it: `**` any number of folders, `*` and
    `?` within one path element, anchored at the context root."""
    assert "[" not in pattern, f"{pattern}: character classes are not modelled here"
    out, i = "^", 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            i += 2 + pattern.startswith("/", i + 2)
            out += ".*" if i >= len(pattern) else "(.*/)?"
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
        i += 1
    return re.compile(out + "$")


def _rules() -> list[tuple[re.Pattern, bool]]:
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = posixpath.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((_pattern_regex(pattern), keep))
    return rules


RULES = _rules()


def left_out(path: str) -> bool:
    """Whether the build context leaves out PATH (relative, '/'-separated): the last rule that
    matches it or one of its parent folders decides, `!` rules putting it back."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for regex, keep in RULES:
        if any(regex.match(c) for c in candidates):
            excluded = not keep
    return excluded


def test_the_matcher_reads_patterns_as_docker_does():
    assert _pattern_regex("**/__pycache__").match("edge/daemon/__pycache__")
    assert _pattern_regex("**/__pycache__").match("__pycache__")
    assert not _pattern_regex("out").match("bench/out")  # anchored at the root
    assert not _pattern_regex(".venv*").match("a/.venv")
    assert left_out(".venv-vllm/lib/python3.11/site-packages/vllm/__init__.py")


def _scripts_run_by_readme() -> list[Path]:
    """The README's two commands and every script they run in turn (bootstrap.sh)."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## The two commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    todo = re.findall(r"^bash (scripts/\S+\.sh)", block, re.M)
    assert todo == ["scripts/sim.sh", "scripts/test.sh"], todo
    seen: list[Path] = []
    while todo:
        script = ROOT / todo.pop()
        if script not in seen:
            seen.append(script)
            todo += re.findall(r"\bbash (scripts/\S+\.sh)", script.read_text())
    return seen


def _shell_value(text: str, name: str) -> str:
    match = re.search(rf"^\s*{name}=([^\s$]+)\s*$", text, re.M)
    assert match, f"no plain assignment of {name}"
    return match.group(1).strip("\"'")


def _generated_by(text: str) -> list[str]:
    """The files a script's `grpc_tools.protoc` call writes (its proto read from `proto=`)."""
    made = []
    for call in re.findall(r"grpc_tools\.protoc[^\n]*", text):
        proto = _shell_value(text, "proto") if "$proto" in call else re.search(r"\S+\.proto", call).group(0)
        include = re.search(r"-I(\S+)", call).group(1)
        stem = posixpath.relpath(proto, include).removesuffix(".proto")
        suffixes = {"--python_out": "_pb2.py", "--grpc_python_out": "_pb2_grpc.py", "--pyi_out": "_pb2.pyi"}
        made += [stem + suffix for flag, suffix in suffixes.items() if flag + "=." in call]
    return made


def _made_by_the_scripts() -> set[str]:
    made = set()
    for script in _scripts_run_by_readme():
        text = script.read_text()
        for name in re.findall(r'-m venv "?\$\{?(\w+)', text):  # every environment it creates
            venv = _shell_value(text, name)
            made |= {venv + "/bin/python", venv + "/.tandem-install-stamp"}
        if re.search(r"pip install[^\n]* -e ", text):  # setuptools' metadata of the checkout
            made.add(PYPROJECT["project"]["name"] + ".egg-info/PKG-INFO")
        made |= set(_generated_by(text))
    assert any("-vllm" in path for path in made), made  # test.sh's .venv-vllm is among them
    return made


def _made_by_the_suite_and_sim() -> set[str]:
    """pytest's cache and bytecode, hypothesis' examples, and every output folder the code
    names as a default (`tandem sim` writes sim/cli.py's DEFAULT_OUT, out/sim)."""
    pytest_options = PYPROJECT["tool"]["pytest"]["ini_options"]
    made = {pytest_options.get("cache_dir", ".pytest_cache") + "/v/cache/nodeids"}
    if any(dep.startswith("hypothesis") for dep in PYPROJECT["project"]["optional-dependencies"]["test"]):
        made.add(".hypothesis/examples/x")
    tops = [d for d in ROOT.iterdir() if d.is_dir() and not d.name.startswith(".")]  # no venvs
    for source in (s for top in tops for s in top.rglob("*.py")):
        folder = source.parent.relative_to(ROOT).as_posix()
        made.add(f"{folder}/__pycache__/{source.stem}.cpython-311.pyc")
        made |= {m + "/x" for m in re.findall(r"""["'](out/[\w./-]*)["']""", source.read_text())}
    return made


def test_every_path_the_readme_commands_make_is_left_out():
    made = _made_by_the_scripts() | _made_by_the_suite_and_sim()
    assert "out/sim/x" in made  # the scan found `tandem sim`'s output
    sent = sorted(p for p in made if not left_out(p))
    assert not sent, f".dockerignore does not leave out {sent}"


def test_what_the_repository_tracks_is_sent():
    """The image runs the checkout (pyproject.toml, the packages, configs/, models/, protos/):
    .dockerignore leaves out nothing that git tracks."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = [f for f in tracked.decode().split("\0") if f]
    assert "pyproject.toml" in files
    dropped = [f for f in files if left_out(f)]
    assert not dropped, f".dockerignore leaves out tracked files {dropped[:20]}"


def test_ignored_paths_in_this_tree_are_left_out():
    """Whatever git ignores here (what running anything made: on CI, test.sh's environments
    and caches as they stand) and a root-level instance of each .gitignore pattern."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z", "--others", "--ignored", "--exclude-standard",
                             "--directory"], cwd=ROOT, capture_output=True, check=True).stdout
    present = {p.rstrip("/") for p in listed.decode().split("\0") if p}
    patterns = [line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()
                if line.strip() and not line.startswith(("#", "!"))]
    examples = {p.strip("/").replace("*", "x") for p in patterns}
    sent = sorted(p for p in present | examples if not left_out(p))
    assert not sent, f"git ignores these, .dockerignore does not: {sent}"


def test_generated_code_left_out_is_generated_in_the_image():
    """The protobuf code bootstrap.sh generates is left out (a stale copy could shadow the
    proto), so each Dockerfile that copies the project must generate it after `COPY . .`."""
    generated = [p for s in _scripts_run_by_readme() for p in _generated_by(s.read_text())]
    assert generated and all(left_out(p) for p in generated)
    bootstrap = (ROOT / "scripts/bootstrap.sh").read_text()
    call = re.search(r"grpc_tools\.protoc[^\n]*", bootstrap).group(0)
    proto = _shell_value(bootstrap, "proto")
    for dockerfile in sorted((ROOT / "docker").glob("Dockerfile*")):
        text = dockerfile.read_text()
        if not re.search(r"^COPY \. \.", text, re.M):
            continue
        after = re.split(r"^COPY \. \.", text, flags=re.M)[1]
        for flag in re.findall(r"--\w+_out=\.", call):
            assert flag in after, f"{dockerfile.name} does not run protoc {flag}"
        assert "grpc_tools.protoc" in after and proto in after, dockerfile.name
