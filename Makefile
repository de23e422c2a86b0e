# Convenience targets (the README's commands remain the reference).
PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)

.PHONY: vagrant-test vagrant-box scenario-netns

# Three real VMs (limiter, client, flood): build or reuse the offline box,
# vagrant up, run the L3/L4/L7 scenario, destroy. Root; see vagrant/README.md.
vagrant-test:
	vagrant/run.sh

# Only (re)build and add the offline Debian box (cached in /var/cache/netlimit-vagrant).
vagrant-box:
	vagrant/build-box.sh

# The same scenario on network namespaces (seconds; root).
scenario-netns:
	$(PYTHON) -m pytest -q tests/scenario
