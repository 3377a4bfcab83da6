"""The central collector: auth -> validate -> encode -> WAL -> sink (see DESIGN.md)."""
