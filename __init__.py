"""eurekamem: the memory service for AI agents.

The code lives in three packages: eurekamem.protocol (sans-IO wire format), eurekamem.client
(thin clients) and eurekamem.daemon (the trio daemon).
"""

__version__ = "0.1.0"
