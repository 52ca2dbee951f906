"""Plugin host: entry-point discovery (stevedore), provider Protocols, pluggy hooks."""
