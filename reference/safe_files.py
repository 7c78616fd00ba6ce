"""Opening files that a stranger may have handed over, for every reader of the command line
(audit traces, ``rattn rank`` data, certificates): nothing is read from anything but a regular
file, and no zip member is decompressed beyond what its compressed bytes can hold.

Pure standard library, so that every package may use it (DESIGN §2).
"""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path
from typing import BinaryIO

#: The most a deflated member can expand: deflate's largest ratio is 1032:1.
DEFLATE_RATIO = 1032


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file. A device such as /dev/zero,
    a FIFO, a directory or a link to one is refused before a byte is read: the file is opened
    without blocking (so a FIFO cannot hang the open), then the descriptor itself is
    ``fstat``-ed (so nothing swapped in between is read). ValueError otherwise; OSError as the
    system raises it (no such file, no permission)."""
    fd = os.open(Path(path), os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a device, a FIFO or a socket"
            raise ValueError(f"not a regular file ({kind})")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_member(info: zipfile.ZipInfo, length: int, suffix: str = "") -> None:
    """A zip member that may be decompressed: ValueError naming it when it does not end with
    ``suffix``, is encrypted, is compressed otherwise than stored or deflated (bzip2 and lzma
    have no bound on their expansion), or declares more bytes than its compressed data can hold
    (stored: as many; deflated: ``DEFLATE_RATIO`` times) or compressed data past the end of the
    file (``length`` bytes)."""
    name = info.filename
    if not name.endswith(suffix):
        raise ValueError(f"member {name!r} is not a {suffix} array")
    if info.flag_bits & 0x1:
        raise ValueError(f"member {name!r} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ValueError(
            f"member {name!r} is compressed with method {info.compress_type}; only stored or "
            "deflated members are read"
        )
    if info.header_offset + info.compress_size > length:
        raise ValueError(f"member {name!r} declares {info.compress_size} bytes past the file's end")
    most = info.compress_size * (1 if info.compress_type == zipfile.ZIP_STORED else DEFLATE_RATIO)
    if info.file_size > most:
        raise ValueError(
            f"member {name!r} declares {info.file_size} bytes, more than its "
            f"{info.compress_size} compressed bytes can hold"
        )
