"""Skills: EurekaClaw's skills/<name>/SKILL.md served by the daemon (format, state, actor)."""
