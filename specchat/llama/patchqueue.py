"""The llama.cpp patch queue applied to a vendored tree: patch by patch, with a three-way fallback, and
which patches a build takes (the Metal one only on Metal builds).

Why a three-way apply: the queue is written against the llama.cpp that the pinned llama-cpp-python
vendors. A plain `git apply` refuses a patch whose context lines moved or changed at all, so trying the
queue on the next llama-cpp-python release would fail on every patch whose neighbourhood upstream
touched, even where the change itself still fits. Each patch records the blob ids of the files it was
written against (`index <old>..<new>`, full ids); with those blobs at hand git merges the patch's
change into the new file as a merge would (`git apply --3way`) and only real conflicts fail. The
blobs come from the pinned tree with the queue applied patch by patch (`base_objects`), borrowed as
git alternates.

Each tree gets a throwaway repository holding only the files the queue touches, one commit per
applied patch; the build removes it again before compiling. Standard library only, like build.py (it
runs in a fresh venv before specchat's dependencies are installed).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: where llama.cpp keeps its Metal backend: a patch that touches nothing else is for Metal builds only
METAL_DIR = "ggml/src/ggml-metal/"
VENDOR = "vendor/llama.cpp"
CLEAN, MERGED, FAILED = "clean", "applied with a 3-way merge", "failed"

_DIFF_LINE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
#: git apply's complaints that name a file: "patch failed: F:12", "F: patch does not apply", ...
_FAILED_FILE = re.compile(
    r"^error: (?:patch failed: (\S+):\d+|(\S+): (?:patch does not apply|does not exist))", re.M
)
_IDENTITY = (
    "-c", "user.name=specchat", "-c", "user.email=specchat@localhost", "-c", "commit.gpgsign=false",
    "-c", "core.autocrlf=false", "-c", "init.defaultBranch=base", "-c", "core.hooksPath=/dev/null",
)  # fmt: skip


def touched_paths(patch: Path) -> list[str]:
    """The files a patch changes, relative to the llama.cpp root, in the order it lists them."""
    out: list[str] = []
    for old, new in _DIFF_LINE.findall(patch.read_text(errors="replace")):
        for path in (old, new):
            if path not in out:
                out.append(path)
    return out


def is_metal_patch(patch: Path) -> bool:
    """A patch for the Metal backend alone: every file it touches is under ggml/src/ggml-metal/."""
    paths = touched_paths(patch)
    return bool(paths) and all(p.startswith(METAL_DIR) for p in paths)


def for_build(patches: Sequence[Path], metal: bool) -> list[Path]:
    """The patches a build takes, in queue order: Metal-only patches on Metal builds only (elsewhere
    their files are not compiled, and leaving them out keeps a non-Metal build's source the CPU queue's)."""
    return [p for p in patches if metal or not is_metal_patch(p)]


@dataclass(frozen=True)
class Applied:
    """How one patch went: CLEAN, MERGED or FAILED; `files`: those merged (MERGED) or that failed."""

    patch: str
    status: str
    files: tuple[str, ...] = ()
    detail: str = ""

    def line(self) -> str:
        where = f" ({', '.join(self.files)})" if self.files else ""
        why = f": {self.detail}" if self.status == FAILED and self.detail and not self.files else ""
        return f"{self.patch}: {self.status}{where}{why}"


def _git_env(root: Path) -> dict[str, str]:
    # the sdist's own .git (a submodule pointer) and any repository above the tree must not be found:
    # git apply inside a repository patches only paths below the current folder and skips the rest
    # with exit status 0
    return {**os.environ, "GIT_CEILING_DIRECTORIES": str(root.resolve().parent), "GIT_CONFIG_NOSYSTEM": "1"}


@dataclass
class Tree:
    """A vendored llama.cpp tree under a throwaway repository that tracks only `paths`."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def open(cls, root: Path, paths: Iterable[str], *, alternates: Path | None = None) -> Tree:
        """Start the repository at `root` with one commit of the listed files that exist there;
        `alternates`: another repository's objects folder whose blobs a three-way apply may read."""
        stale = root / ".git"  # a submodule pointer in the sdist: git must not follow it
        if stale.is_file():
            stale.unlink()
        tree = cls(root, _git_env(root))
        tree.git("init", "-q")
        if alternates is not None:
            (root / ".git" / "objects" / "info" / "alternates").write_text(f"{alternates.resolve()}\n")
        present = [p for p in dict.fromkeys(paths) if (root / p).is_file()]
        if present:
            tree.git("add", "-f", "--", *present)
        tree.git("commit", "-q", "--allow-empty", "--no-verify", "-m", "base")
        return tree

    def git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["git", *_IDENTITY, *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"git {args[0]} failed in {self.root}: {done.stderr.strip()[-300:]}")
        return done

    @property
    def objects(self) -> Path:
        return self.root / ".git" / "objects"

    def apply(self, patch: Path) -> Applied:
        """Apply one patch: as it is when it fits, else merged three ways; committed when it applied,
        the tree left as before it when it failed."""
        text = str(patch.resolve())
        if self.git("apply", "--check", text, check=False).returncode == 0:
            self.git("apply", "--index", "--whitespace=nowarn", text)
            self._commit(patch.name)
            return Applied(patch.name, CLEAN)
        done = self.git("apply", "--3way", "--whitespace=nowarn", text, check=False)
        unmerged = self.git("diff", "--name-only", "--diff-filter=U", check=False).stdout.split()
        if done.returncode == 0 and not unmerged:
            merged = re.findall(r"^Applied patch to '(.+?)'", done.stderr, re.MULTILINE)
            self._commit(patch.name)
            return Applied(patch.name, MERGED, tuple(merged) or tuple(touched_paths(patch)))
        failed = unmerged or list(dict.fromkeys(a or b for a, b in _FAILED_FILE.findall(done.stderr)))
        lines = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
        self.git("reset", "-q", "--hard", "HEAD", check=False)
        return Applied(patch.name, FAILED, tuple(failed), (lines or ["git apply failed"])[-1])

    def _commit(self, message: str) -> None:
        self.git("commit", "-q", "--allow-empty", "--no-verify", "-m", message)

    def last_diff(self) -> str:
        """The last applied patch as a diff of this tree (full blob ids, for the next three-way apply)."""
        return self.git("diff", "--full-index", "HEAD~1", "HEAD").stdout

    def close(self) -> None:
        """Remove the repository, leaving the tree's files as the patches made them."""
        shutil.rmtree(self.root / ".git", ignore_errors=True)


def queue_paths(patches: Iterable[Path]) -> list[str]:
    return list(dict.fromkeys(p for patch in patches for p in touched_paths(patch)))


def apply_queue(root: Path, patches: Sequence[Path], *, alternates: Path | None = None,
                keep_going: bool = False, keep_repo: bool = False) -> list[Applied]:  # fmt: skip
    """Apply the queue in order; stops at the first failure unless `keep_going` (then each later
    patch is tried on the tree without the failed ones). The repository is removed afterwards unless
    `keep_repo`."""
    tree = Tree.open(root, queue_paths(patches), alternates=alternates)
    out: list[Applied] = []
    try:
        for patch in patches:
            out.append(tree.apply(patch))
            if out[-1].status == FAILED and not keep_going:
                break
    finally:
        if not keep_repo:
            tree.close()
    return out


def extract_vendor(sdist: Path, dest: Path, paths: Iterable[str]) -> Path:
    """Unpack only `paths` of the sdist's vendored llama.cpp (and its CHANGELOG) into `dest`; returns
    the llama.cpp root there. A rebase reads a handful of files, not the whole 176 MB tree."""
    wanted = set(paths)
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            _, _, rest = m.name.partition("/")
            inside = rest[len(VENDOR) + 1 :] if rest.startswith(VENDOR + "/") else None
            if (m.isfile() and inside in wanted) or rest == "CHANGELOG.md":
                members.append(m)
        if not members:
            raise ValueError(f"{sdist.name} holds none of the files the queue patches under {VENDOR}")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover - older Pythons
            tar.extractall(dest, members=members)
    roots = [p for p in dest.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise ValueError(f"unexpected layout in {sdist.name}")
    llama = roots[0] / VENDOR
    llama.mkdir(parents=True, exist_ok=True)
    return llama


def vendored_commit(sdist_root: Path) -> str:
    """The llama.cpp commit an unpacked sdist vendors, from its CHANGELOG's newest 'update llama.cpp
    to ggml-org/llama.cpp@<commit>' line ('' when it names none)."""
    changelog = sdist_root / "CHANGELOG.md"
    text = changelog.read_text(errors="replace") if changelog.is_file() else ""
    found = re.search(r"llama\.cpp@([0-9a-f]{7,40})", text)
    return found.group(1) if found else ""


def base_objects(pinned_sdist: Path, patches: Sequence[Path], workdir: Path) -> Path:
    """A repository of the pinned tree's queued files with the queue applied patch by patch: every
    blob the patches name as their preimage. Returns its objects folder (for `alternates`)."""
    llama = extract_vendor(pinned_sdist, workdir, queue_paths(patches))
    results = apply_queue(llama, patches, keep_going=True, keep_repo=True)
    bad = [r for r in results if r.status == FAILED]
    if bad:
        raise ValueError(f"the queue does not apply to {pinned_sdist.name} itself: {bad[0].line()}")
    return llama / ".git" / "objects"


def rebase(target_sdist: Path, patches: Sequence[Path], pinned_sdist: Path, workdir: Path,
           write: Path | None = None) -> tuple[str, list[Applied]]:  # fmt: skip
    """Try the queue on another llama-cpp-python sdist, three ways where it does not fit as it is.
    Returns (the llama.cpp commit that sdist vendors, one result per patch); `write`: a folder for
    the patches as they applied there (each header kept, the diff taken from the new tree)."""
    objects = base_objects(pinned_sdist, patches, workdir / "base")
    llama = extract_vendor(target_sdist, workdir / "target", queue_paths(patches))
    commit = vendored_commit(llama.parents[1])
    tree = Tree.open(llama, queue_paths(patches), alternates=objects)
    results: list[Applied] = []
    for patch in patches:
        results.append(tree.apply(patch))
        if write is not None and results[-1].status != FAILED:
            write.mkdir(parents=True, exist_ok=True)
            (write / patch.name).write_text(header(patch) + tree.last_diff())
    return commit, results


def header(patch: Path) -> str:
    """A patch's text before its first diff: what it changes and why."""
    text = patch.read_text(errors="replace")
    cut = text.find("diff --git ")
    return text if cut < 0 else text[:cut]
