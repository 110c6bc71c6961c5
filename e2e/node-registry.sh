# shellcheck shell=bash
# The real node's image registry, sourced by e2e/node.sh: CNCF distribution (built from its Go module
# by e2e/build.sh) on the bridge address, as a registry a cluster really has: TLS with a certificate
# from the cluster's CA and htpasswd authentication, so an image or a chart is pulled only with
# credentials. The node's containerd trusts that CA for it (hosts.toml); nothing else is trusted.
#
# ${NODE_DIR}/registry/registry.env tells the tests where it is and how to log in:
#   RLJOB_E2E_REGISTRY (host:port), RLJOB_E2E_REGISTRY_USER, RLJOB_E2E_REGISTRY_PASSWORD,
#   RLJOB_E2E_REGISTRY_CA (the CA file), RLJOB_E2E_REGISTRY_CERT_DIR (ca.crt alone, for buildah).
# shellcheck disable=SC2034 # REGISTRY_* are read by e2e/node.sh

REGISTRY_DIR="${NODE_DIR}/registry"
REGISTRY_USER="rljob-e2e"

registry_address() { echo "${NODE_GATEWAY}:${REGISTRY_PORT}"; }

registry_pki() {
  sign_cert registry "/CN=rljob-e2e-registry" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:${NODE_GATEWAY}"
}

write_registry_config() {
  local password
  mkdir -p "${REGISTRY_DIR}/data" "${REGISTRY_DIR}/certs"
  chmod 700 "${REGISTRY_DIR}"
  password="$(openssl rand -hex 16)"
  htpasswd -Bbn "${REGISTRY_USER}" "${password}" >"${REGISTRY_DIR}/htpasswd" 2>/dev/null
  cp "${PKI}/ca.crt" "${REGISTRY_DIR}/certs/ca.crt"
  cat >"${REGISTRY_DIR}/config.yml" <<EOF
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage:
  filesystem: {rootdirectory: ${REGISTRY_DIR}/data}
  delete: {enabled: true}
http:
  addr: $(registry_address)
  tls: {certificate: ${PKI}/registry.crt, key: ${PKI}/registry.key}
auth:
  htpasswd: {realm: rljob-e2e, path: ${REGISTRY_DIR}/htpasswd}
EOF
  cat >"${REGISTRY_DIR}/registry.env" <<EOF
RLJOB_E2E_REGISTRY=$(registry_address)
RLJOB_E2E_REGISTRY_USER=${REGISTRY_USER}
RLJOB_E2E_REGISTRY_PASSWORD=${password}
RLJOB_E2E_REGISTRY_CA=${PKI}/ca.crt
RLJOB_E2E_REGISTRY_CERT_DIR=${REGISTRY_DIR}/certs
EOF
  chmod 600 "${REGISTRY_DIR}/registry.env"
  # containerd's CRI reads <config_path>/<host:port>/hosts.toml at each pull
  mkdir -p "${CTRD_DIR}/certs.d/$(registry_address)"
  cat >"${CTRD_DIR}/certs.d/$(registry_address)/hosts.toml" <<EOF
server = "https://$(registry_address)"
[host."https://$(registry_address)"]
  capabilities = ["pull", "resolve"]
  ca = "${PKI}/ca.crt"
EOF
}

# Up when /v2/ answers, and answers 401 without credentials (authentication is on).
registry_ready() {
  [[ "$(curl -s -o /dev/null -w '%{http_code}' --cacert "${PKI}/ca.crt" "https://$(registry_address)/v2/")" == 401 ]]
}

start_registry() {
  launch registry serve "${REGISTRY_DIR}/config.yml"
  wait_for "registry at $(registry_address) (401 without credentials)" registry registry_ready
}
