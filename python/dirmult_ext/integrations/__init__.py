"""Interfaces to other libraries: each module imports its library only when used."""
