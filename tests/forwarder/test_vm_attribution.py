raise SystemExit(77)
