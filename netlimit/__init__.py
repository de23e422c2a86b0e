"""netlimit: rate limits in the kernel (nftables, iptables, tc) and in an HTTP sidecar, from one YAML file."""

# The one source of the version: pyproject.toml reads it ([tool.setuptools.dynamic]),
# `netlimit --version` prints it, the metrics' netlimit_build_info{version} carries it,
# scripts/release.sh names the artifacts after it, and CHANGELOG.md has a section for it.
__version__ = "0.2.0"
