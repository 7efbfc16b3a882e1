"""The `cudal1` command line: thin Typer wrappers over the library (one library call per command)."""
