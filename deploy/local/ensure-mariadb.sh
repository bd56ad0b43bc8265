#!/usr/bin/env bash
# Make sure a MariaDB answers where the tests look for one (SY_MYSQL_DSN, default
# mysql://root@127.0.0.1:3306). Does nothing when it already does. Otherwise, on this
# (Debian) machine: installs mariadb-server with apt-get if needed, starts it in the
# background, waits until it listens, and lets root log in over TCP without a password,
# as local development and the tests expect. Needs root for anything beyond the check.
set -euo pipefail

dsn="${SY_MYSQL_DSN:-mysql://root@127.0.0.1:3306}"
read -r host port < <(python3 -c '
import sys
from urllib.parse import urlparse
u = urlparse(sys.argv[1])
print(u.hostname or "127.0.0.1", u.port or 3306)' "$dsn")
mariadbd="${MARIADBD:-/usr/sbin/mariadbd}"

accepts() {
    python3 -c '
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()
except OSError:
    sys.exit(1)' "$host" "$port"
}

say() { echo "ensure-mariadb: $*"; }

if accepts; then
    say "$host:$port accepts connections"
    exit 0
fi

case "$host" in
    127.0.0.1 | localhost | ::1) ;;
    *)
        say "$host:$port does not accept connections, and it is not this machine: start it there" >&2
        exit 1
        ;;
esac
if [ "$(id -u)" -ne 0 ]; then
    say "$host:$port does not accept connections; installing or starting MariaDB needs root" >&2
    exit 1
fi

if [ ! -x "$mariadbd" ]; then
    say "installing mariadb-server with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends mariadb-server
    mariadbd=/usr/sbin/mariadbd
fi

# A package installed without a running init system may have left no data directory.
if [ ! -d /var/lib/mysql/mysql ]; then
    say "initialising /var/lib/mysql"
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
fi
install -d -o mysql -g mysql /run/mysqld /var/log/mysql

say "starting $mariadbd on port $port"
start-stop-daemon --start --oknodo --background --exec "$mariadbd" \
    --output /var/log/mysql/ensure-mariadb.log -- --user=mysql --port="$port"

for _ in $(seq 1 60); do
    accepts && break
    sleep 1
done
if ! accepts; then
    say "MariaDB did not accept connections on $host:$port within 60 s;" \
        "see /var/log/mysql/ensure-mariadb.log" >&2
    exit 1
fi

# A fresh Debian install authenticates root@localhost by unix socket only. Allow root
# without a password from 127.0.0.1 as well (local development and tests only).
client="$(command -v mariadb || command -v mysql || true)"
if [ -z "$client" ]; then
    say "started; no mariadb client found to check root's TCP login" >&2
elif "$client" --protocol=tcp -h 127.0.0.1 -P "$port" -u root -e 'SELECT 1' >/dev/null 2>&1; then
    say "started; root logs in over TCP"
else
    say "started; allowing root without a password over TCP from 127.0.0.1"
    "$client" --protocol=socket -u root <<'SQL'
ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
FLUSH PRIVILEGES;
SQL
fi
