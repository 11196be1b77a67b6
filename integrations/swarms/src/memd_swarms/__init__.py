"""memd-swarms: one call wires a Swarms agent to memd (``memd_swarms.attach(agent)``).

Importing this package is cheap: it imports neither swarms nor litellm; it works
on the agent it is handed.
"""

from memd_swarms._attach import WIRING_ATTRIBUTE, AttachError, __version__, attach
from memd_swarms._descriptor import DESCRIPTOR_NAME
from memd_swarms._probe import UnsupportedSwarms

__all__ = [
    "DESCRIPTOR_NAME",
    "WIRING_ATTRIBUTE",
    "AttachError",
    "UnsupportedSwarms",
    "__version__",
    "attach",
]
