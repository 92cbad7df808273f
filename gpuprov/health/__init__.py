"""The passive health tier: `gpuprov-health` (check.py, copied to every GPU host as one file) and its fault codes
(codes.py, from gpuprov/data/health_codes.yaml). See docs/health.md."""
