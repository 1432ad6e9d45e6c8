# TLS on the local test servers, for the suite's TLS tests. Sourced by scripts/test.
#
# Makes a throwaway CA (and an unrelated second CA, for the wrong-CA cases) with
# openssl, a server certificate for `localhost` only (so that 127.0.0.1 is a wrong host
# name) and a client certificate; then turns TLS on in the local PostgreSQL (with roles
# that only `hostssl` admits), MariaDB (users that REQUIRE SSL / X509) and RabbitMQ (a
# TLS listener on 5671). Idempotent: certificates are made again only when missing or
# expiring within a day. Nothing here is committed; the files live in $TLS_DIR.

TLS_DIR="${SWITCHYARD_TEST_TLS_DIR:-/var/lib/switchyard-test-tls}"

tls_sudo() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# The CA, the other CA, the server certificate (DNS:localhost only) and a client
# certificate whose CN is the PostgreSQL role that logs in with it.
make_test_certs() {
    if [ -s "$TLS_DIR/ca.pem" ] && [ -s "$TLS_DIR/other-ca.pem" ] && [ -s "$TLS_DIR/client.key" ] &&
        openssl x509 -checkend 86400 -noout -in "$TLS_DIR/server.pem" >/dev/null 2>&1; then
        return 0
    fi
    command -v openssl >/dev/null || apt_install openssl || return 1
    log "making a throwaway CA and certificates in $TLS_DIR"
    tls_sudo mkdir -p "$TLS_DIR" || return 1
    local tmp
    tmp="$(mktemp -d)"
    (
        set -e
        cd "$tmp"
        openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=switchyard test CA" \
            -keyout ca.key -out ca.pem 2>/dev/null
        openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=unrelated CA" \
            -keyout other-ca.key -out other-ca.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr 2>/dev/null
        printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
            -extfile server.ext -out server.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=switchyard_cert" -keyout client.key -out client.csr 2>/dev/null
        printf 'extendedKeyUsage=clientAuth\n' >client.ext
        openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
            -extfile client.ext -out client.pem 2>/dev/null
        rm -f ./*.csr ./*.ext ./*.srl ca.key other-ca.key
    ) || { rm -rf "$tmp"; return 1; }
    tls_sudo cp "$tmp"/* "$TLS_DIR"/ && rm -rf "$tmp"
    tls_sudo chmod 0755 "$TLS_DIR" && tls_sudo chmod 0644 "$TLS_DIR"/*.pem && tls_sudo chmod 0640 "$TLS_DIR"/*.key
    # The test processes read the client key; each server gets its own copy of the
    # server key, owned by its user (PostgreSQL refuses a key others can read).
    tls_sudo chmod 0644 "$TLS_DIR/client.key"
    local user
    for user in postgres mysql rabbitmq; do
        id "$user" >/dev/null 2>&1 || continue
        tls_sudo mkdir -p "$TLS_DIR/$user"
        tls_sudo install -o "$user" -m 0600 "$TLS_DIR/server.key" "$TLS_DIR/$user/server.key"
        tls_sudo install -o "$user" -m 0644 "$TLS_DIR/server.pem" "$TLS_DIR/$user/server.pem"
        tls_sudo install -o "$user" -m 0644 "$TLS_DIR/ca.pem" "$TLS_DIR/$user/ca.pem"
    done
    tls_sudo rm -f "$TLS_DIR/server.key"
    TLS_CERTS_CHANGED=1
}

# PostgreSQL: our certificate, and two roles that only TLS admits: switchyard_tls
# (no password) and switchyard_cert (logs in with the client certificate).
ensure_postgres_tls() {
    local admin="${SWITCHYARD_TEST_PG_URL:-postgres://postgres@127.0.0.1:5432/test}"
    local dir="$TLS_DIR/postgres"
    psql "$admin" -Atq -c "ALTER SYSTEM SET ssl = on" \
        -c "ALTER SYSTEM SET ssl_cert_file = '$dir/server.pem'" \
        -c "ALTER SYSTEM SET ssl_key_file = '$dir/server.key'" \
        -c "ALTER SYSTEM SET ssl_ca_file = '$dir/ca.pem'" >/dev/null || return 1
    local hba
    hba="$(psql "$admin" -Atqc 'SHOW hba_file')" || return 1
    if ! tls_sudo grep -q 'switchyard-test-tls' "$hba"; then
        log "admitting the TLS-only test roles in $hba"
        local rules
        rules="$(printf '%s\n' \
            '# switchyard-test-tls: roles that only TLS admits (scripts/lib/tls.sh)' \
            'hostnossl all switchyard_tls,switchyard_cert all reject' \
            'hostssl all switchyard_tls all trust' \
            'hostssl all switchyard_cert all cert')"
        { printf '%s\n' "$rules"; tls_sudo cat "$hba"; } >"$hba.switchyard" &&
            tls_sudo cp "$hba.switchyard" "$hba" && rm -f "$hba.switchyard" || return 1
    fi
    psql "$admin" -Atqc "SELECT pg_reload_conf()" >/dev/null || return 1
    # Superusers, like the postgres role the rest of the suite uses: the conformance
    # suite runs over TLS with the same cases (schemas, planted rows).
    psql "$admin" -Atq >/dev/null <<'SQL' || return 1
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'switchyard_tls') THEN CREATE ROLE switchyard_tls LOGIN SUPERUSER; END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'switchyard_cert') THEN CREATE ROLE switchyard_cert LOGIN SUPERUSER; END IF;
END $$;
SQL
    sleep 0.5
    export SWITCHYARD_TEST_PG_TLS_URL="postgres://switchyard_tls@localhost:5432/test?sslmode=verify-full&sslrootcert=$TLS_DIR/ca.pem"
    psql "$SWITCHYARD_TEST_PG_TLS_URL" -Atqc 'SELECT 1' >/dev/null ||
        { log "PostgreSQL refuses verify-full TLS with the test CA"; return 1; }
    if psql "postgres://switchyard_tls@localhost:5432/test?sslmode=disable" -Atqc 'SELECT 1' >/dev/null 2>&1; then
        log "PostgreSQL admits switchyard_tls without TLS: the hostssl rules are not in force"
        return 1
    fi
}

# MariaDB: our certificate (a restart the first time: its TLS settings are read at
# start), and users that REQUIRE SSL or a client certificate.
ensure_mariadb_tls() {
    local my=(mariadb --protocol=tcp -h 127.0.0.1 -P 3306 -uroot)
    # my.cnf itself: read by every layout (Debian's includes conf.d directories, a
    # minimal one may not).
    local cnf=/etc/mysql/my.cnf
    local dir="$TLS_DIR/mysql"
    if ! tls_sudo grep -q 'switchyard-test-tls' "$cnf" 2>/dev/null; then
        printf '\n# switchyard-test-tls (scripts/lib/tls.sh)\n[mariadbd]\nssl-ca = %s\nssl-cert = %s\nssl-key = %s\n' \
            "$dir/ca.pem" "$dir/server.pem" "$dir/server.key" | tls_sudo tee -a "$cnf" >/dev/null || return 1
    fi
    if [ "$("${my[@]}" -Nse "SELECT @@have_ssl")" != "YES" ]; then
        log "restarting MariaDB with TLS on"
        "${my[@]}" -e "SHUTDOWN" || mariadb-admin shutdown || true
        # The process outlives its last answer while it flushes; start only once it is gone.
        for _ in $(seq 60); do pgrep -x mariadbd >/dev/null || pgrep -x mysqld >/dev/null || break; sleep 1; done
        tls_sudo mkdir -p /run/mysqld && tls_sudo chown mysql:mysql /run/mysqld 2>/dev/null || true
        tls_sudo start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql || true
        for _ in $(seq 30); do "${my[@]}" -e 'SELECT 1' >/dev/null 2>&1 && break; sleep 1; done
        [ "$("${my[@]}" -Nse "SELECT @@have_ssl")" = "YES" ] || { log "MariaDB did not start with TLS"; return 1; }
    elif [ -n "${TLS_CERTS_CHANGED:-}" ]; then
        "${my[@]}" -e "FLUSH SSL" || return 1
    fi
    "${my[@]}" -e "CREATE USER IF NOT EXISTS 'switchyard_tls'@'%' REQUIRE SSL;
        GRANT ALL PRIVILEGES ON *.* TO 'switchyard_tls'@'%';
        CREATE USER IF NOT EXISTS 'switchyard_x509'@'%' REQUIRE X509;
        GRANT ALL PRIVILEGES ON *.* TO 'switchyard_x509'@'%';" || return 1
    export SWITCHYARD_TEST_MYSQL_TLS_URL="mysql://switchyard_tls@localhost:3306/test?ssl-mode=VERIFY_IDENTITY&ssl-ca=$TLS_DIR/ca.pem"
}

# RabbitMQ: a TLS listener on 5671 (client certificates verified when sent). Started in
# the running node when it is up, and written to rabbitmq.conf for its next start.
ensure_rabbitmq_tls() {
    local conf=/etc/rabbitmq/rabbitmq.conf
    local dir="$TLS_DIR/rabbitmq"
    if ! tls_sudo grep -q 'switchyard-test-tls' "$conf" 2>/dev/null; then
        printf '%s\n' '# switchyard-test-tls (scripts/lib/tls.sh)' \
            'listeners.ssl.default = 5671' \
            "ssl_options.cacertfile = $dir/ca.pem" \
            "ssl_options.certfile = $dir/server.pem" \
            "ssl_options.keyfile = $dir/server.key" \
            'ssl_options.verify = verify_peer' \
            'ssl_options.fail_if_no_peer_cert = false' | tls_sudo tee -a "$conf" >/dev/null || return 1
    fi
    if [ -n "${TLS_CERTS_CHANGED:-}" ]; then
        tls_sudo rabbitmqctl eval 'ssl:clear_pem_cache().' >/dev/null 2>&1 || true
    fi
    if ! (exec 3<>/dev/tcp/127.0.0.1/5671) 2>/dev/null; then
        log "starting RabbitMQ's TLS listener on 5671"
        tls_sudo rabbitmqctl eval "rabbit_networking:start_ssl_listener(5671, [{cacertfile, \"$dir/ca.pem\"}, {certfile, \"$dir/server.pem\"}, {keyfile, \"$dir/server.key\"}, {verify, verify_peer}, {fail_if_no_peer_cert, false}], 1)." >/dev/null || return 1
        for _ in $(seq 10); do (exec 3<>/dev/tcp/127.0.0.1/5671) 2>/dev/null && break; sleep 1; done
        (exec 3<>/dev/tcp/127.0.0.1/5671) 2>/dev/null || { log "RabbitMQ's TLS listener did not start"; return 1; }
    fi
    export SWITCHYARD_TEST_AMQPS_URL="amqps://guest:guest@localhost:5671/%2f?cacertfile=$TLS_DIR/ca.pem"
}

# Everything above; a failure names the server it concerns.
ensure_tls() {
    make_test_certs || { log "could not make the test certificates"; return 1; }
    export SWITCHYARD_TEST_TLS_DIR="$TLS_DIR"
    local ok=0
    ensure_postgres_tls || { log "PostgreSQL: TLS could not be set up"; ok=1; }
    ensure_mariadb_tls || { log "MariaDB: TLS could not be set up"; ok=1; }
    ensure_rabbitmq_tls || { log "RabbitMQ: TLS could not be set up"; ok=1; }
    return "$ok"
}
