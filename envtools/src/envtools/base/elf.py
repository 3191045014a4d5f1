"""Just enough ELF reading for validate: machine, class, DT_NEEDED, RPATH/RUNPATH, SONAME,
whether it is a program (PT_INTERP), and whether the file is whole.

A few dozen lines of ``struct`` instead of a dependency: envtools is a noarch package
and only needs the dynamic section, read from the first bytes and the section headers.
A file cut short (a copy that ran out of space, a download that stopped) still starts
with a valid header; the loader would refuse it ("file too short"), so the program
headers' segments and the section table are checked against the file's size.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

ELF_MAGIC = b"\x7fELF"
EM_NAMES = {3: "x86", 62: "x86_64", 21: "ppc64", 183: "aarch64", 243: "riscv", 22: "s390"}
#: the e_machine (and byte order) a conda subdir's binaries must have
SUBDIR_MACHINE = {
    "linux-64": (62, "<"),
    "linux-ppc64le": (21, "<"),
    "linux-aarch64": (183, "<"),
    "linux-s390x": (22, ">"),
}
DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH = 1, 14, 15, 29
SHT_DYNAMIC = 6
ET_DYN, ET_EXEC = 3, 2
PT_LOAD, PT_INTERP = 1, 3


@dataclass
class ElfInfo:
    machine: int
    endian: str  # "<" or ">"
    elfclass: int  # 32 or 64
    etype: int
    needed: list[str] = field(default_factory=list)
    rpath: list[str] = field(default_factory=list)
    runpath: list[str] = field(default_factory=list)
    soname: str | None = None
    #: has PT_INTERP: a program the kernel starts (a PIE is ET_DYN too), not a library
    program: bool = False
    #: why the loader would refuse the file (truncated...), or None
    damaged: str | None = None

    @property
    def machine_name(self) -> str:
        return EM_NAMES.get(self.machine, f"machine {self.machine}")


def is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == ELF_MAGIC
    except OSError:
        return False


PT_INTERP = 3


def is_program(path: str | os.PathLike[str]) -> bool:
    """Is this an ELF *program* (ET_EXEC, or a PIE: ET_DYN with a PT_INTERP header), as
    opposed to a shared library? The kernel resolves a program's symlinks before it runs
    it (its ``$ORIGIN`` is its real directory); a library's ``$ORIGIN`` is the directory
    of the path the loader opened, symlink or not."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if len(head) < 52 or head[:4] != ELF_MAGIC:
                return False
            end = "<" if head[5] == 1 else ">"
            etype, = struct.unpack_from(end + "H", head, 16)
            if etype == ET_EXEC:
                return True
            if etype != ET_DYN:
                return False
            if head[4] == 2:
                phoff, = struct.unpack_from(end + "Q", head, 32)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
            else:
                phoff, = struct.unpack_from(end + "I", head, 28)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 42)
            if not phoff or not phnum or phnum > 4096 or phentsize < 4:
                return False
            fh.seek(phoff)
            ph = fh.read(phentsize * phnum)
            return any(struct.unpack_from(end + "I", ph, i * phentsize)[0] == PT_INTERP
                       for i in range(len(ph) // phentsize))
    except (OSError, struct.error):
        return False


def read_elf(path: str | os.PathLike[str]) -> ElfInfo | None:
    """Parse the header and the dynamic section; None if not an ELF file. A file that
    starts like ELF but is cut short or unreadable past its header comes back with
    ``damaged`` set (and whatever could be read)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if head[:4] != ELF_MAGIC:
                return None
            if len(head) < 52:
                return ElfInfo(0, "<", 0, 0, damaged=f"truncated: only {len(head)} bytes")
            size = os.fstat(fh.fileno()).st_size
            cls = 64 if head[4] == 2 else 32
            end = "<" if head[5] == 1 else ">"
            etype, machine = struct.unpack_from(end + "HH", head, 16)
            info = ElfInfo(machine, end, cls, etype)
            if cls == 64:
                phoff, shoff = struct.unpack_from(end + "QQ", head, 32)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", head, 54)
            else:
                phoff, shoff = struct.unpack_from(end + "II", head, 28)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", head, 42)
            _program_headers(fh, info, size, phoff, phentsize, phnum)
            if info.damaged:
                return info
            if not shoff or not shnum or shnum > 4096:
                return info
            if shoff + shentsize * shnum > size:
                info.damaged = (f"truncated: {size} bytes, its section table ends at "
                                f"{shoff + shentsize * shnum}")
                return info
            _dynamic_section(fh, info, shoff, shentsize, shnum, cls, end)
            return info
    except OSError:
        return None
    except struct.error:
        return ElfInfo(0, "<", 0, 0, damaged="malformed ELF headers")


def _program_headers(fh, info: ElfInfo, size: int, phoff: int, phentsize: int,
                     phnum: int) -> None:
    """PT_INTERP (a program) and the file size the loadable segments need."""
    if not phoff or not phnum or phnum > 4096:
        return
    fh.seek(phoff)
    ph = fh.read(phentsize * phnum)
    if len(ph) < phentsize * phnum:
        info.damaged = f"truncated: {size} bytes, its program headers end at " \
                       f"{phoff + phentsize * phnum}"
        return
    need = 0
    for i in range(phnum):
        off = i * phentsize
        if info.elfclass == 64:
            p_type, = struct.unpack_from(info.endian + "I", ph, off)
            p_offset, = struct.unpack_from(info.endian + "Q", ph, off + 8)
            p_filesz, = struct.unpack_from(info.endian + "Q", ph, off + 32)
        else:
            p_type, p_offset = struct.unpack_from(info.endian + "II", ph, off)
            p_filesz, = struct.unpack_from(info.endian + "I", ph, off + 16)
        if p_type == PT_INTERP:
            info.program = True
        elif p_type == PT_LOAD:
            need = max(need, p_offset + p_filesz)
    if need > size:
        info.damaged = f"truncated: {size} bytes, its loadable segments need {need}"


def _dynamic_section(fh, info: ElfInfo, shoff: int, shentsize: int, shnum: int, cls: int,
                     end: str) -> None:
    fh.seek(shoff)
    sh = fh.read(shentsize * shnum)
    sections = []
    for i in range(shnum):
        off = i * shentsize
        if cls == 64:
            s_type, = struct.unpack_from(end + "I", sh, off + 4)
            s_offset, s_size = struct.unpack_from(end + "QQ", sh, off + 24)
            s_link, = struct.unpack_from(end + "I", sh, off + 40)
        else:
            s_type, = struct.unpack_from(end + "I", sh, off + 4)
            s_offset, s_size = struct.unpack_from(end + "II", sh, off + 16)
            s_link, = struct.unpack_from(end + "I", sh, off + 24)
        sections.append((s_type, s_offset, s_size, s_link))
    for s_type, s_offset, s_size, s_link in sections:
        if s_type != SHT_DYNAMIC or s_link >= len(sections):
            continue
        fh.seek(s_offset)
        dyn = fh.read(s_size)
        _, str_off, str_size, _ = sections[s_link]
        fh.seek(str_off)
        strtab = fh.read(str_size)
        entsize = 16 if cls == 64 else 8
        fmt = end + ("qQ" if cls == 64 else "iI")
        for j in range(0, len(dyn) - entsize + 1, entsize):
            tag, val = struct.unpack_from(fmt, dyn, j)
            if tag == 0:
                break
            if tag in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH):
                e = strtab.find(b"\0", val)
                s = strtab[val: e if e >= 0 else None].decode(errors="replace")
                if tag == DT_NEEDED:
                    info.needed.append(s)
                elif tag == DT_SONAME:
                    info.soname = s
                elif tag == DT_RPATH:
                    info.rpath += [p for p in s.split(":") if p]
                else:
                    info.runpath += [p for p in s.split(":") if p]


def system_library_dirs() -> list[str]:
    """Directories the dynamic loader searches by default (ld.so.conf plus the defaults)."""
    dirs: list[str] = []

    def add_conf(path: str, depth: int = 0) -> None:
        import glob

        if depth > 4:
            return
        try:
            with open(path) as fh:
                lines = fh.read().splitlines()
        except OSError:
            return
        for line in lines:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("include"):
                for inc in sorted(glob.glob(line.split(None, 1)[1].strip())):
                    add_conf(inc, depth + 1)
            elif line.startswith("/"):
                dirs.append(line)

    add_conf("/etc/ld.so.conf")
    dirs += ["/lib64", "/usr/lib64", "/lib", "/usr/lib"]
    seen, out = set(), []
    for d in dirs:
        if d not in seen and os.path.isdir(d):
            seen.add(d)
            out.append(d)
    return out
