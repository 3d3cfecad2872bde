"""Switchyard's leaf package: wire types, errors, config schema, protocols and clocks.

Imports only the standard library and msgspec; every other package may import it.
"""
