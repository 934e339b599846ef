def main() -> None:
    raise SystemExit("cli not yet built")
