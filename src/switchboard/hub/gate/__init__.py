"""Who may connect, as whom, into which workspace, within which limits: the gatekeeper."""
