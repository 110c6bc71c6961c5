#!/usr/bin/env bash
# grpcurl (github.com/fullstorydev/grpcurl), built from its Go module at a pinned version, for the tests
# that list and describe rljob's services by reflection as a user would. Once per version, into the e2e
# cache beside the control plane (sharing Go's module and build caches).
#
#   e2e/grpcurl.sh         build it unless built; prints its path
#   e2e/grpcurl.sh path    print the path it is (or would be) built at
set -euo pipefail

# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_go_env

GRPCURL_VERSION=v1.9.4
out="${E2E_CACHE}/grpcurl-${GRPCURL_VERSION}"
if [[ "${1:-}" == path ]]; then
  echo "${out}/grpcurl"
  exit 0
fi
if [[ ! -x "${out}/grpcurl" ]]; then
  # `go install module@version` builds with the module's own go.mod and go.sum: its pinned dependencies
  mkdir -p "${out}"
  GOBIN="${out}" go install -ldflags "-s -w" "github.com/fullstorydev/grpcurl/cmd/grpcurl@${GRPCURL_VERSION}"
fi
echo "${out}/grpcurl"
