"""Two result sets compared: the pairs and their verdicts (pairs), and how a comparison reads (display)."""
