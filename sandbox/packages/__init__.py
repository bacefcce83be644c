"""Packages for runs: which distributions a project needs, and installing them in a sandbox."""
