"""teraio.parse_tiers: the tier spec text that every teraio command takes (docs/formats.md, "Tier
specs") as HostTier / FileTier objects, read by the C++ parser `teraio train --tier` uses, so a
spec means the same thing in a script's argument as on the command line."""
from __future__ import annotations

from typing import List

from . import _C


def parse_tiers(text: str) -> List[object]:
    """'host:64GiB,file:/mnt/nvme:500GiB' -> [HostTier(64 GiB), FileTier(['/mnt/nvme'], 500 GiB)].

    Each spec is host:CAPACITY[:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]] or
    file:DIR[,DIR...]:CAPACITY[:READ_GBPS:WRITE_GBPS[:BOTH_GBPS]]; specs are separated by commas (a file
    tier's directories keep theirs: its list ends at the ':' before the capacity). Bandwidths left
    out are measured by the Session. Raises teraio.Error with a one-line message.
    """
    from . import Error, FileTier, HostTier  # the package defines them before importing this module

    if not isinstance(text, str):
        raise Error(f"parse_tiers: expected a string such as 'host:64GiB,file:/mnt/nvme:500GiB', "
                    f"got {type(text).__name__}")
    tiers: List[object] = []
    for d in _C.parse_tier_list(text, "parse_tiers"):
        if d["kind"] == "host":
            tiers.append(HostTier(d["capacity_bytes"], d["read_gbps"], d["write_gbps"], d["duplex_gbps"]))
        else:
            tiers.append(FileTier(d["paths"], d["capacity_bytes"], d["read_gbps"], d["write_gbps"],
                                  d["duplex_gbps"]))
    return tiers
