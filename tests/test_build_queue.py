"""The patch queue as the build applies it: a three-way fallback, the rebase report on another sdist,
the Metal patch for Metal builds only, and a Metal build that falls back to the CPU queue when it fails.

Fake sdists (a tarball with a tiny vendored llama.cpp) and patches written here; real git. The last
tests read the pinned sdist from the build cache and skip without it."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from specchat.llama import build, installed, patchqueue

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

CPU_FILE = "ggml/src/ggml-cpu/ops.c"
METAL_FILE = "ggml/src/ggml-metal/ops.cpp"
LINES = [f"line {i}\n" for i in range(1, 13)]


def _sdist(folder: Path, version: str, files: dict[str, str], commit: str = "abcdef1") -> Path:
    """A llama_cpp_python-VERSION.tar.gz with the given files under vendor/llama.cpp."""
    top = f"llama_cpp_python-{version}"
    members = {
        f"{top}/CHANGELOG.md": f"## [{version}]\n\n- feat: update llama.cpp to ggml-org/llama.cpp@{commit}\n",
        f"{top}/llama_cpp/__init__.py": f'__version__ = "{version}"\n',
        **{f"{top}/vendor/llama.cpp/{k}": v for k, v in files.items()},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _patch(tmp: Path, name: str, header: str, changes: dict[str, tuple[str, str]]) -> Path:
    """A patch in the queue's form (a header, then `git diff --full-index`) from before/after texts."""
    work = tmp / f"scratch-{name}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)

    def git(*args: str) -> str:
        argv = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args]
        return subprocess.run(argv, cwd=work, capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    for rel, (before, _) in changes.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(before)
    git("add", "-A")
    git("commit", "-q", "-m", "before")
    for rel, (_, after) in changes.items():
        (work / rel).write_text(after)
    path = tmp / "patches" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "\n" + git("diff", "--full-index"))
    return path


def _with(lines: list[str], **at: str) -> str:
    out = list(lines)
    for key, text in at.items():
        out[int(key[1:]) - 1] = text + "\n"
    return "".join(out)


@pytest.fixture
def queue(tmp_path):
    """Two CPU patches (the second on top of the first) and a Metal one, written against `pinned`."""
    base = "".join(LINES)
    first = _with(LINES, l2="line 2 patched")
    second = _with(LINES, l2="line 2 patched", l9="line 9 patched")
    metal_before, metal_after = "kernel a\nkernel b\n", "kernel a\nkernel b for verify rows\n"
    patches = [
        _patch(tmp_path, "0001-cpu-a.patch", "cpu: line 2", {CPU_FILE: (base, first)}),
        _patch(tmp_path, "0002-cpu-b.patch", "cpu: line 9", {CPU_FILE: (first, second)}),
        _patch(tmp_path, "0005-metal.patch", "metal: kernel b", {METAL_FILE: (metal_before, metal_after)}),
    ]
    pinned = _sdist(tmp_path, "0.3.36", {CPU_FILE: base, METAL_FILE: metal_before})
    return patches, pinned


def test_a_patch_that_touches_only_metal_files_is_for_metal_builds_only(queue):
    patches, _ = queue
    assert patchqueue.touched_paths(patches[2]) == [METAL_FILE]
    assert [patchqueue.is_metal_patch(p) for p in patches] == [False, False, True]
    assert patchqueue.for_build(patches, metal=False) == patches[:2]
    assert patchqueue.for_build(patches, metal=True) == patches


@pytest.mark.parametrize(
    ("system", "cmake_args", "metal"),
    [
        ("Darwin", "", True),
        ("Darwin", "-DGGML_METAL=OFF", True),  # llama-cpp-python's CMakeLists forces Metal on for APPLE
        ("Linux", "", False),
        ("Linux", "-DGGML_CUDA=on", False),
        ("Linux", "-DGGML_METAL=ON", True),
        ("Linux", "-DGGML_METAL:BOOL=1", True),
        ("Linux", "-DGGML_METAL=ON -DGGML_METAL=OFF", False),
        ("Windows", "-DGGML_METAL=no", False),
    ],
)
def test_a_metal_build_is_macos_or_cmake_args_that_turn_metal_on(system, cmake_args, metal):
    assert build.is_metal_build(cmake_args, system=system) is metal


def test_the_queue_on_its_own_sdist_applies_clean(tmp_path, queue):
    patches, pinned = queue
    commit, results = patchqueue.rebase(pinned, patches, pinned, tmp_path / "work")
    assert commit == "abcdef1"
    assert [(r.patch, r.status) for r in results] == [(p.name, patchqueue.CLEAN) for p in patches]


def test_another_sdist_gets_a_three_way_merge_where_context_moved_and_a_named_failure(tmp_path, queue):
    """Upstream changed line 7, inside the context of 0002's change to line 9 (a plain apply refuses
    it, a three-way merge keeps both), and the very line 0005 changes (a conflict); 0001's change to
    line 2 still fits as it is."""
    patches, pinned = queue
    newer = _sdist(
        tmp_path / "newer",
        "0.3.37",
        {CPU_FILE: _with(LINES, l7="line 7 upstream"), METAL_FILE: "kernel a\nkernel b upstream\n"},
        commit="1234567",
    )
    commit, results = patchqueue.rebase(newer, patches, pinned, tmp_path / "work", write=tmp_path / "out")
    assert commit == "1234567"
    assert [r.status for r in results] == [patchqueue.CLEAN, patchqueue.MERGED, patchqueue.FAILED]
    assert results[1].files == (CPU_FILE,)
    assert results[2].files == (METAL_FILE,)
    assert results[2].line() == "0005-metal.patch: failed (ggml/src/ggml-metal/ops.cpp)"
    rebased = (tmp_path / "out" / "0002-cpu-b.patch").read_text()
    assert (
        rebased.startswith("cpu: line 9") and "+line 9 patched" in rebased and " line 7 upstream" in rebased
    )
    assert not (tmp_path / "out" / "0005-metal.patch").exists()


def test_rebase_reports_one_line_per_patch_and_fails_when_one_does_not_apply(tmp_path, queue, monkeypatch):
    patches, pinned = queue
    monkeypatch.setattr(build, "pinned_sdist", lambda **_: pinned)
    newer = _sdist(
        tmp_path / "newer", "0.3.37", {CPU_FILE: "".join(LINES), METAL_FILE: "kernel a\nkernel c\n"}
    )
    said: list[str] = []
    assert build.rebase_report(newer, patches=patches, say=said.append) == 1
    assert said[0].startswith("the patch queue on llama_cpp_python-0.3.37.tar.gz (llama.cpp abcdef1)")
    assert said[1:4] == [
        "  0001-cpu-a.patch: clean",
        "  0002-cpu-b.patch: clean",
        "  0005-metal.patch: failed (ggml/src/ggml-metal/ops.cpp)",
    ]
    assert said[-1] == "2 of 3 patches apply (2 clean, 0 merged three ways, 1 failed)"
    assert build.rebase_report(pinned, patches=patches, say=said.append) == 0
    assert build.rebase_report(tmp_path / "nothing.tar.gz", patches=patches, say=said.append) == 2
    assert said[-1].startswith("error: no sdist at")


def test_the_build_applies_the_queue_and_leaves_no_repository_in_the_tree(tmp_path, queue):
    patches, pinned = queue
    src = build.prepare_source(pinned, patches, tmp_path / "src", "0.3.36+specchat.x")
    llama = src / "vendor" / "llama.cpp"
    assert (llama / CPU_FILE).read_text() == _with(LINES, l2="line 2 patched", l9="line 9 patched")
    assert "for verify rows" in (llama / METAL_FILE).read_text()
    assert not (llama / ".git").exists()
    assert '__version__ = "0.3.36+specchat.x"' in (src / "llama_cpp" / "__init__.py").read_text()


def test_a_build_whose_patch_does_not_apply_names_it_and_its_file(tmp_path, queue):
    patches, _ = queue
    other = _sdist(
        tmp_path / "other", "0.3.36", {CPU_FILE: "something else\n", METAL_FILE: "kernel a\nkernel b\n"}
    )
    with pytest.raises(
        build.BuildError, match=r"0001-cpu-a\.patch does not apply to .*\(ggml/src/ggml-cpu/ops\.c\)"
    ):
        build.prepare_source(other, patches, tmp_path / "src", "0.3.36+specchat.x")


class FakeBuilder:
    """Compiles nothing: writes a wheel named for the stamped version, and fails like a compiler would
    on a Metal kernel with the Metal patch in it (when `metal_breaks`)."""

    def __init__(self, metal_breaks: bool) -> None:
        self.metal_breaks = metal_breaks
        self.trees: list[str] = []

    def __call__(self, src: Path, staging: Path, env: dict[str, str], log: Path) -> int:
        metal = (src / "vendor" / "llama.cpp" / METAL_FILE).read_text()
        self.trees.append("metal patched" if "verify rows" in metal else "metal as shipped")
        if self.metal_breaks and "verify rows" in metal:
            return 1
        version = (src / "llama_cpp" / "__init__.py").read_text().split('"')[1]
        staging.mkdir(parents=True, exist_ok=True)
        (staging / f"llama_cpp_python-{version}-py3-none-any.whl").write_text("wheel")
        return 0


@pytest.fixture
def cache(tmp_path, queue, monkeypatch):
    """The build cache in tmp_path, with the fake pinned sdist in it."""
    _, pinned = queue
    monkeypatch.setenv("SPECCHAT_BUILD_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "sdist").mkdir(parents=True)
    shutil.copy(pinned, tmp_path / "cache" / "sdist" / pinned.name)
    return tmp_path / "cache"


def test_a_metal_build_that_fails_with_the_metal_patch_is_built_again_without_it(queue, cache):
    patches, _ = queue
    builder, said = FakeBuilder(metal_breaks=True), []
    wheel = build.build_wheel(patches=patches, cmake_args="-DGGML_METAL=ON", builder=builder, say=said.append)
    assert builder.trees == ["metal patched", "metal as shipped"]
    assert build.wheel_version(wheel) == build.local_version("0.3.36", patches[:2])
    assert any("building again without the Metal patch (0005)" in line for line in said)
    # cached under the inputs' key: the next install takes it instead of failing again
    again = build.build_wheel(
        patches=patches, cmake_args="-DGGML_METAL=ON", builder=FakeBuilder(True), say=said.append
    )
    assert again == wheel


def test_a_metal_build_that_compiles_holds_the_whole_queue_and_others_never_see_the_metal_patch(queue, cache):
    patches, _ = queue
    metal = FakeBuilder(metal_breaks=False)
    wheel = build.build_wheel(
        patches=patches, cmake_args="-DGGML_METAL=ON", builder=metal, say=lambda _: None
    )
    assert metal.trees == ["metal patched"]
    assert build.wheel_version(wheel) == build.local_version("0.3.36", patches)
    cpu = FakeBuilder(metal_breaks=True)
    wheel = build.build_wheel(patches=patches, cmake_args="-DGGML_CUDA=on", builder=cpu, say=lambda _: None)
    assert cpu.trees == ["metal as shipped"]
    assert build.wheel_version(wheel) == build.local_version("0.3.36", patches[:2])


def test_a_cpu_build_that_fails_is_an_error_not_a_second_build(queue, cache):
    patches, _ = queue

    def broken(src: Path, staging: Path, env: dict[str, str], log: Path) -> int:
        return 2

    with pytest.raises(build.BuildError, match="exit 2"):
        build.build_wheel(patches=patches[:2], cmake_args="", builder=broken, say=lambda _: None)


def test_the_wheel_cache_key_changes_with_any_patch_of_the_queue(queue):
    patches, _ = queue
    key = build.build_key("0.3.36", patches, "", cpu="avx2")
    patches[2].write_text(
        patches[2].read_text().replace("+kernel b for verify rows", "+kernel b, for verify rows")
    )
    assert build.build_key("0.3.36", patches, "", cpu="avx2") != key


def _pinned() -> Path:
    sdist = build.cache_dir() / "sdist" / f"llama_cpp_python-{build.PINNED}.tar.gz"
    if not sdist.is_file():
        pytest.skip(f"{sdist} is not there (make install downloads it)")
    return sdist


def test_the_repository_queue_applies_clean_to_the_pinned_sdist(tmp_path):
    """Every patch of patches/llama.cpp, the Metal one included, as it is (no merge needed)."""
    queue = build.patch_queue()
    commit, results = patchqueue.rebase(_pinned(), queue, _pinned(), tmp_path)
    assert commit.startswith("0c1e570")
    assert [r.status for r in results] == [patchqueue.CLEAN] * len(queue)
    assert any(patchqueue.is_metal_patch(p) for p in queue)


#: what every patch's header says first: the llama.cpp it applies to, by short and full commit, and the
#: llama-cpp-python release that vendors it
BASE = re.compile(
    r"Applies to llama\.cpp ([0-9a-f]{7,12}) \(ggml-org/llama\.cpp@([0-9a-f]{40})\), the\s+tree "
    r"llama-cpp-python (\S+) vendors"
)


def _bases() -> dict[str, tuple[str, str, str]]:
    """(short commit, full commit, release) each patch of the repository's queue names, by file name."""
    found = {p.name: BASE.search(patchqueue.header(p)) for p in build.patch_queue()}
    missing = [name for name, m in found.items() if m is None]
    assert not missing, (
        f"{', '.join(missing)}: a patch's header (the text before its first diff) must name the llama.cpp "
        "it applies to, as the others do: 'Applies to llama.cpp SHORT (ggml-org/llama.cpp@FULL), the tree "
        f"llama-cpp-python {build.PINNED} vendors'"
    )
    return {name: m.groups() for name, m in found.items() if m is not None}


def test_every_patch_header_names_the_llama_cpp_base_it_applies_to():
    """One base for the whole queue, the pinned release's: a patch written against another tree, or
    one whose header leaves the base out, fails here (the headers are all a rebase has to go by)."""
    bases = _bases()
    assert bases and all(p.suffix == ".patch" for p in build.patch_queue())
    for name, (short, full, release) in bases.items():
        assert full.startswith(short) and release == build.PINNED, (name, short, full, release)
    assert len({full for _, full, _ in bases.values()}) == 1, bases


def test_the_base_the_headers_name_is_the_one_the_pinned_sdist_vendors(tmp_path):
    """Its CHANGELOG's newest 'update llama.cpp to ggml-org/llama.cpp@...' (read from the start of the
    tarball, without unpacking the rest)."""
    with tarfile.open(_pinned(), "r|gz") as tar:
        for member in tar:
            if member.name.endswith("/CHANGELOG.md") and member.name.count("/") == 1:
                (tmp_path / "CHANGELOG.md").write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
                break
    vendored = patchqueue.vendored_commit(tmp_path)
    assert vendored and all(full.startswith(vendored) for _, full, _ in _bases().values())


def test_the_metal_patch_compiles_as_cpp_here(tmp_path):
    """The patched ggml-metal-ops.cpp is plain C++ (its Objective-C neighbours are not): a syntax check
    with g++ against the vendored headers catches a broken Metal patch without a Mac."""
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    queue = build.patch_queue()
    metal = [p for p in queue if patchqueue.is_metal_patch(p)]
    paths = [*patchqueue.queue_paths(metal), "ggml/include/ggml.h"]
    llama = patchqueue.extract_vendor(_pinned(), tmp_path, _headers(paths))
    assert all(r.status == patchqueue.CLEAN for r in patchqueue.apply_queue(llama, metal))
    for rel in patchqueue.queue_paths(metal):
        if rel.endswith(".cpp"):
            argv = [
                "g++",
                "-fsyntax-only",
                "-std=c++17",
                "-Iggml/include",
                "-Iggml/src",
                "-Iggml/src/ggml-metal",
                rel,
            ]
            done = subprocess.run(argv, cwd=llama, capture_output=True, text=True, check=False)
            assert done.returncode == 0, done.stderr[-2000:]


def _headers(paths: list[str]) -> list[str]:
    """The patched files and every header they may include (ggml's public, internal and Metal ones)."""
    with tarfile.open(_pinned()) as tar:
        names = [
            m.name.split("/vendor/llama.cpp/", 1)[-1]
            for m in tar.getmembers()
            if "/vendor/llama.cpp/" in m.name
        ]
    wanted = ("ggml/include/", "ggml/src/ggml-metal/", "ggml/src/")
    headers = [n for n in names if n.endswith(".h") and n.startswith(wanted) and n.count("/") <= 3]
    return [*paths, *headers]


# --- what is installed: the pin, and the patched build told from a stock one -----------------------------


def test_pyproject_requires_the_release_the_build_pins():
    """One source of truth: `build.PINNED`. A `pip install .` outside the Makefile then gets that
    release (stock), and the patched wheel's local version satisfies the same requirement."""
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    deps = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    assert [d for d in deps if d.startswith(build.PACKAGE)] == [f"{build.PACKAGE}=={build.PINNED}"]
    specifiers = pytest.importorskip("packaging.specifiers")
    pin = specifiers.SpecifierSet(f"=={build.PINNED}")
    assert pin.contains(build.local_version(build.PINNED, build.patch_queue()))
    assert pin.contains(build.PINNED) and not pin.contains("0.3.16") and not pin.contains("0.3.37")


def _checkout(tmp_path: Path, patches: list[Path]) -> Path:
    """A folder laid out as a checkout is, holding `patches` as its queue."""
    folder = tmp_path / "checkout" / "patches" / "llama.cpp"
    folder.mkdir(parents=True)
    for p in patches:
        shutil.copy(p, folder / p.name)
    return tmp_path / "checkout"


def test_the_installed_build_is_told_patched_or_stock_by_its_version(tmp_path, queue):
    root = _checkout(tmp_path, queue[0])
    ours = build.patch_queue(root)
    for held in (patchqueue.for_build(ours, metal=False), ours):  # a CPU build's queue, a Metal build's
        version = build.local_version(build.PINNED, held)
        patched = installed.describe(version, root=root)
        assert (patched.kind, patched.queue) == ("patched", build.queue_hash(held))
        assert patched.warning() is None and patched.advice() is None
        assert patched.line() == (
            f"patched llama-cpp-python {version} (specchat's llama.cpp patch queue {build.queue_hash(held)})"
        )
    stock = installed.describe(build.PINNED, root=root)
    assert (stock.kind, stock.queue) == ("stock", None)
    warning = stock.warning()
    assert warning is not None and "\n" not in warning
    assert warning.startswith(f"stock llama-cpp-python {build.PINNED} (no llama.cpp patch queue): ")
    assert "`make install`" in warning and "`python -m specchat.llama.build install`" in warning
    older = installed.describe("0.3.16", root=root)
    assert older.kind == "stock" and f"specchat pins {build.PINNED}" in older.line()


def test_a_patched_build_of_another_queue_is_named_where_the_checkout_can_tell(tmp_path, queue):
    other = f"{build.PINNED}+specchat.0123456789"
    stale = installed.describe(other, root=_checkout(tmp_path, queue[0]))
    assert stale.kind == "patched, another queue" and "make install" in (stale.warning() or "")
    # installed from a wheel (no patches beside the package): nothing to compare with, so not stale
    assert installed.describe(other, root=tmp_path / "site-packages").kind == "patched"
    missing = installed.Installed(None)
    assert missing.kind == "not installed" and "make install" in (missing.advice() or "")


def test_a_patch_headers_words_do_not_change_the_queue_hash(tmp_path):
    """The header says why a patch exists; rewording it must not rebuild llama-cpp-python, while a
    change to the diff itself must."""
    body = "diff --git a/x.c b/x.c\n--- a/x.c\n+++ b/x.c\n@@ -1 +1 @@\n-a\n+b\n"
    patch = tmp_path / "0001-x.patch"
    patch.write_text("x: why\n\nApplies to llama.cpp 0c1e57098.\n\n" + body)
    before = build.queue_hash([patch])
    patch.write_text(
        "x: why, said better (a diff --git in the words)\n\nApplies to llama.cpp 0c1e57098.\n\n" + body
    )
    assert build.queue_hash([patch]) == before
    patch.write_text("x: why\n\n" + body.replace("+b", "+c"))
    assert build.queue_hash([patch]) != before
