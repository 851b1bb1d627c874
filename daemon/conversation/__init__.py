"""The conversation tier: groups' raw messages, stored durably, searched by BM25 + dense fusion."""
