#!/usr/bin/env bash
# A real, single-machine SLURM cluster for trying lcab's submitit/Hydra SLURM launch path
# locally and in CI:
#
#   bash launchers/slurm_local.sh up      # install (Debian) + start; prints `export SLURM_CONF=...`
#   bash launchers/slurm_local.sh status  # exit 0 iff the cluster is up and both nodes usable
#   bash launchers/slurm_local.sh down    # stop every daemon we started, remove all state
#
# Daemons: munged, mariadbd (private data dir), slurmdbd (accounting: without it sacct does not
# work, so submitit never sees a cancelled job finish and waits forever), slurmctld, and two
# slurmd emulating nodes n1 and n2 (4 CPUs each, partition `debug`).
#
# State lives in $LCAB_SLURM_DIR (default /tmp/lcab-slurm): configs, logs, spool, the MariaDB
# data dir, one PID file per daemon (pids/), and `env` to `source`. `down` stops daemons by
# those recorded PIDs only (never by process name) and deletes the directory.
#
# Ports (TCP, 127.0.0.1), from LCAB_SLURM_PORT_BASE (default 26810). The base sits below Linux's
# ephemeral range (32768-60999), so an outgoing connection cannot already hold one of them,
# and away from the SLURM/MySQL defaults (6817-6819/3306), so a real installation can coexist:
#   base+1, base+2  slurmd n1, n2      base+6  mariadbd
#   base+7          slurmctld          base+9  slurmdbd
#
# Needs root (it edits /etc/hosts, runs munged as the munge user and mariadbd as mysql).
# As non-root it re-runs itself through `sudo -n` when that works; `status` needs no root.
# Usage notes, ports and known harmless log noise: launchers/README.md.
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
D=${LCAB_SLURM_DIR:-/tmp/lcab-slurm}
case $D in /*) ;; *) D=$PWD/$D ;; esac   # every path in slurm.conf must be absolute
D=${D%/}
PORT_BASE=${LCAB_SLURM_PORT_BASE:-26810}
SLURMD_PORT_N1=$((PORT_BASE + 1))
SLURMD_PORT_N2=$((PORT_BASE + 2))
SQL_PORT=$((PORT_BASE + 6))
CTLD_PORT=$((PORT_BASE + 7))
DBD_PORT=$((PORT_BASE + 9))
CLUSTER=lcab
NODES=(n1 n2)
PKGS=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
# The /etc/hosts line we add; it names the state dir, so down removes exactly this line (matched
# whole, not as a substring) and leaves another state dir's line alone.
HOSTS_LINE="127.0.0.1 ${NODES[*]} # lcab-slurm-local $D"
MARKER=.lcab-slurm-local                 # a state dir without this file is not ours: never rm it
STOP_ORDER=(slurmctld slurmd-n1 slurmd-n2 slurmdbd mariadbd munged)
MUNGE_RUN=/run/munge                     # munged's compiled-in socket dir; Debian never creates it
                                         # here (no systemd tmpfiles), so up does
export SLURM_CONF=$D/slurm.conf          # every slurm client and daemon below reads this

usec() { local t=${EPOCHREALTIME/[.,]/}; echo $((10#$t)); }
T0=$(usec)
# log MSG: progress on stderr with the time since start, so stdout carries only the export line.
log() {
  local ds=$((($(usec) - T0) / 100000))
  printf '[slurm_local %3d.%ds] %s\n' $((ds / 10)) $((ds % 10)) "$*" >&2
}
die() { local rc=$1; shift; log "ERROR: $*"; exit "$rc"; }

# ---------------------------------------------------------------- process helpers
# alive NAME PID: the PID runs and is the daemon we expect. A zombie counts as dead: the
# daemons are orphans, and PID 1 of some sandboxes (gVisor) reaps them late or never, so a
# killed daemon can sit <defunct> while `kill -0` still succeeds. Checking the command name
# guards against a PID reused since it was recorded (e.g. /tmp survived a reboot).
alive() {
  local name=${1%-n[0-9]*} pid=$2 stat comm
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z && $comm == "$name" ]]
}

recorded_pid() { cat "$D/pids/$1.pid" 2>/dev/null || true; }

# start_bg NAME CMD...: CMD keeps the daemon in the foreground (-D), so the PID we record is
# the daemon's own and no daemon PID file has to be trusted; we put it in the background.
# setsid: own session, so a CI runner killing the step's process group, or a terminal hang-up,
# does not take the daemon with it. Without job control the background child is no group
# leader, so setsid execs in place and $! is the daemon's own PID. `9<&-` drops the lock fd
# (see main) so that daemons do not hold the lock for their whole life.
start_bg() {
  local name=$1; shift
  setsid "$@" >"$D/log/$name.out" 2>&1 </dev/null 9<&- &
  echo $! >"$D/pids/$name.pid"
}

# stop NAME: TERM the recorded PID, poll up to 5 s, then KILL; forget the PID file.
STOPPED=()
stop() {
  local name=$1 pid i
  pid=$(recorded_pid "$name")
  [[ -n $pid ]] || return 0
  if alive "$name" "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do alive "$name" "$pid" || break; sleep 0.1; done
    if alive "$name" "$pid"; then
      log "$name ($pid) ignored SIGTERM for 5 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 20; i++)); do alive "$name" "$pid" || break; sleep 0.1; done
    fi
    log "stopped $name ($pid)"
    STOPPED+=("$pid")
  fi
  rm -f "$D/pids/$name.pid"
}

# wait_until SECONDS WHAT DAEMON CMD...: poll CMD every 0.2 s; give up early when DAEMON
# (a pids/ name, or - for none) has died, instead of sitting out the whole timeout.
wait_until() {
  local t=$1 what=$2 daemon=$3 end; shift 3
  end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    if [[ $daemon != - ]] && ! alive "$daemon" "$(recorded_pid "$daemon")"; then
      log "$daemon exited while waiting for $what (see $D/log/)"; return 1
    fi
    ((SECONDS < end)) || { log "timed out after ${t}s waiting for $what"; return 1; }
    sleep 0.2
  done
}

port_open() { (: >"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
sql() { mariadb --no-defaults --socket="$D/mysql/mysqld.sock" -uroot "$@"; }
sql_ok() { mariadb-admin --no-defaults --socket="$D/mysql/mysqld.sock" -uroot ping; }
dbd_ok() { timeout 10 sacctmgr -n show cluster; }
no_jobs() { [[ -z $(timeout 5 squeue -h -o %A 2>/dev/null) ]]; }

# nodes_ok: sinfo reaches slurmctld and n1, n2 are idle, mix or alloc ("idle*" = not responding).
nodes_ok() {
  local out n st
  out=$(timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
  for n in "${NODES[@]}"; do
    st=$(awk -v n="$n" '$1 == n { print $2; exit }' <<<"$out")
    case $st in idle | mix | alloc) ;; *) return 1 ;; esac
  done
}

# healthy: our state dir, every recorded daemon alive, munge answering, both nodes usable.
healthy() {
  local name pid
  [[ -f $D/$MARKER ]] || return 1
  for name in "${STOP_ORDER[@]}"; do
    [[ $name == munged && ! -f $D/pids/munged.pid ]] && continue   # munged we did not start
    pid=$(recorded_pid "$name")
    alive "$name" "$pid" || return 1
  done
  munge_ok && nodes_ok
}

remove_hosts_line() {
  grep -qxF "$HOSTS_LINE" /etc/hosts 2>/dev/null || return 0
  local kept
  kept=$(grep -vxF "$HOSTS_LINE" /etc/hosts || true)
  # Rewrite in place (no sed -i): in containers /etc/hosts is a bind mount, which a
  # rename-based edit cannot replace ("Device or resource busy").
  printf '%s\n' "$kept" >/etc/hosts
  log "removed the n1/n2 line from /etc/hosts"
}

# need_root ARGS...: re-run as root through passwordless sudo, else exit 2.
can_sudo() { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }
need_root() {
  ((EUID == 0)) && return 0
  if can_sudo; then
    exec sudo -n LCAB_SLURM_DIR="$D" LCAB_SLURM_PORT_BASE="$PORT_BASE" bash "$SELF" "$@"
  fi
  die 2 "'$1' must run as root (it edits /etc/hosts and runs daemons as root, munge and mysql)"
}

missing_pkgs() {
  local p
  for p in "${PKGS[@]}"; do
    [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null) == installed ]] || echo "$p"
  done
}

# ---------------------------------------------------------------- down
do_down() {
  local name ids
  if [[ -f $D/$MARKER ]]; then
    # Cancel jobs first: a running job's slurmstepd outlives its slurmd, and we may not hunt
    # processes by name. With KillWait=2 the steps are gone once squeue is empty.
    if alive slurmctld "$(recorded_pid slurmctld)"; then
      ids=$(timeout 10 squeue -h -o %A 2>/dev/null || true)
      if [[ -n $ids ]]; then
        log "cancelling jobs: $(tr '\n' ' ' <<<"$ids")"
        # shellcheck disable=SC2086  # one job id per word
        scancel $ids 2>/dev/null || true
        wait_until 15 "cancelled jobs to finish" - no_jobs || true
      fi
    fi
    for name in "${STOP_ORDER[@]}"; do stop "$name"; done
    # The dead daemons are orphans that PID 1 must reap; in gVisor that takes a second or
    # two. Give it up to 3 s, so that `ps` right after down is clean; a leftover is harmless.
    local i p left=("${STOPPED[@]}")
    for ((i = 0; i < 30 && ${#left[@]}; i++)); do
      sleep 0.1
      left=()
      for p in "${STOPPED[@]}"; do [[ -e /proc/$p ]] && left+=("$p"); done
    done
    ((${#left[@]} == 0)) || log "still <defunct>, awaiting PID 1's reaping (harmless): ${left[*]}"
    if [[ -f $D/created-run-munge ]]; then   # the munge run dir only if up created it
      rm -f "$MUNGE_RUN"/munged.pid "$MUNGE_RUN"/munge.socket.2 "$MUNGE_RUN"/munge.socket.2.lock
      rmdir "$MUNGE_RUN" 2>/dev/null || true
    fi
    rm -rf "${D:?}"
    log "removed $D"
  fi
  remove_hosts_line
}

# ---------------------------------------------------------------- up
install_pkgs() {
  local missing
  missing=$(missing_pkgs | tr '\n' ' ')
  [[ -z $missing ]] && return 0
  command -v apt-get >/dev/null || die 2 "packages missing ($missing) and no apt-get: install them by hand"
  log "installing: $missing(apt-get)"
  # Without systemd, postinst scripts fall back to /etc/init.d and would start a system
  # munged/mariadbd (default ports, /var/lib/mysql) that we neither want nor track. A
  # policy-rc.d answering 101 ("action forbidden") stops that; Docker images ship one already.
  local own_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  local rc=0
  {
    # Lock::Timeout: wait for another apt/dpkg (unattended upgrades, the browser tests installing
    # Chromium) instead of failing.
    apt-get update -qq -o DPkg::Lock::Timeout=600 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o DPkg::Lock::Timeout=600 "${PKGS[@]}"
  } >"$D/log/apt.log" 2>&1 || rc=$?
  ((own_policy)) && rm -f /usr/sbin/policy-rc.d
  if ((rc != 0)); then tail -n 20 "$D/log/apt.log" >&2; die 1 "apt-get failed (rc=$rc)"; fi
  log "packages installed"
}

write_configs() {
  local host=$1 pass=$2   # pass: random per up, only for the private MariaDB on 127.0.0.1
  cat >"$D/slurm.conf" <<EOF
# Written by launchers/slurm_local.sh; removed by its 'down'.
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits cred_expire seconds before it may start again (slurm.conf(5), AuthInfo;
# default 120 s, 5 the least slurmctld accepts): 10 s keeps the pre-emption test short and still
# leaves a launch credential ample time to reach slurmd (one local RPC) on a loaded 2-core machine.
AuthInfo=cred_expire=10
# No PMIx library in Debian's slurm build; pmi is not needed for submitit/torch (gloo over TCP).
MpiDefault=none
# No cgroups: the sandbox/CI kernel may only offer cgroup v1 mounts or none; no cgroup.conf.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# A job becomes runnable without an event to trigger scheduling when its begin time passes (a
# requeued job, after cred_expire): the main loop (sched_interval, default 60 s) or the backfill
# loop (bf_interval, default 30 s) starts it. Two nodes make a full pass cost microseconds, so
# both run every second; batch_sched_delay=0 schedules a submitted job at once (default 3 s).
SchedulerParameters=sched_interval=1,bf_interval=1,batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Lets each node claim CPUs=4 although the machine may have only 2 cores.
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$D/state
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmdSpoolDir=$D/spool/slurmd-%n
SlurmdLogFile=$D/log/slurmd-%n.log
InactiveLimit=0
KillWait=2
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
Waittime=0
# Both "nodes" are this host: slurmd -N n1 / -N n2, told apart by port.
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$SLURMD_PORT_N1 CPUs=4 RealMemory=4000 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$SLURMD_PORT_N2 CPUs=4 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  # slurmdbd reads slurmdbd.conf from the directory of $SLURM_CONF and refuses it unless it is
  # mode 0600 and owned by SlurmUser (root). umask first: the password is never world-readable.
  (
    umask 077
    cat >"$D/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$SQL_PORT
StorageUser=slurm
StoragePass=$pass
StorageLoc=slurm_acct_db
LogFile=$D/log/slurmdbd.log
PidFile=$D/run/slurmdbd.pid
EOF
  )
  chmod 600 "$D/slurmdbd.conf"
}

start_munge() {
  [[ -s /etc/munge/munge.key ]] || {
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  }
  if munge_ok; then
    # Some munged already serves the default socket (a system one, or a leftover): use it,
    # and record no PID, so that down leaves it alone.
    log "munged already running: reusing it (down will not stop it)"
    return 0
  fi
  if [[ ! -d $MUNGE_RUN ]]; then
    mkdir -p "$MUNGE_RUN" && : >"$D/created-run-munge"
  fi
  chown munge:munge "$MUNGE_RUN" && chmod 755 "$MUNGE_RUN"
  # munged must run as the munge user (it refuses root-owned keys/dirs otherwise); it
  # daemonizes itself and writes its own PID file, which we copy: runuser's $! is not munged.
  rm -f "$MUNGE_RUN/munged.pid"
  runuser -u munge -- /usr/sbin/munged 9<&- </dev/null >"$D/log/munged.out" 2>&1
  wait_until 10 munged - test -s "$MUNGE_RUN/munged.pid"
  cp "$MUNGE_RUN/munged.pid" "$D/pids/munged.pid"
  wait_until 10 "munge to answer" munged munge_ok
  log "munged up"
}

start_mariadb() {
  local pass=$1
  # A private data dir, socket and port: nothing shared with a system MariaDB, and all of it
  # disappears with the state dir. --no-defaults keeps /etc/mysql/*.cnf (socket, port) out.
  # Socket and PID file go into the data dir: mariadbd runs as mysql and cannot write $D/run.
  mkdir -p "$D/mysql" && chown mysql:mysql "$D/mysql"
  mariadb-install-db --no-defaults --user=mysql --datadir="$D/mysql" \
    --auth-root-authentication-method=socket --skip-test-db >"$D/log/mariadb-install.log" 2>&1 ||
    { tail -n 20 "$D/log/mariadb-install.log" >&2; die 1 "mariadb-install-db failed"; }
  start_bg mariadbd /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$D/mysql" \
    --socket="$D/mysql/mysqld.sock" --pid-file="$D/mysql/mariadbd.pid" \
    --bind-address=127.0.0.1 --port="$SQL_PORT" --skip-name-resolve
  wait_until 30 mariadbd mariadbd sql_ok
  # slurmdbd talks TCP (a "localhost" host would make libmysqlclient use /run/mysqld's socket).
  sql -e "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
          GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  log "mariadbd up (port $SQL_PORT)"
}

do_up() {
  local host pass p n
  if healthy; then
    log "already up and healthy ($D); nothing to do"
    printf 'export SLURM_CONF=%s\n' "$D/slurm.conf"
    return 0
  fi
  if [[ -f $D/$MARKER ]]; then
    log "found a partial/dead cluster in $D: tearing it down first"
    do_down
  elif [[ -d $D && -n $(ls -A "$D") ]]; then
    die 2 "$D exists, is not empty and was not made by this script; set LCAB_SLURM_DIR"
  fi
  for p in "$SLURMD_PORT_N1" "$SLURMD_PORT_N2" "$SQL_PORT" "$CTLD_PORT" "$DBD_PORT"; do
    port_open "$p" && die 1 "port $p is already in use; pick another LCAB_SLURM_PORT_BASE"
  done

  mkdir -p "$D"/{run,state,log,pids} "$D/spool/slurmd-n1" "$D/spool/slurmd-n2"
  : >"$D/$MARKER"
  install_pkgs

  # Node names must resolve: submitit's TorchDistributedEnvironment sets MASTER_ADDR=n1, and
  # c10d then retries "Name or service not known" forever.
  if ! grep -qxF "$HOSTS_LINE" /etc/hosts; then
    [[ -z $(tail -c1 /etc/hosts) ]] || echo >>/etc/hosts
    echo "$HOSTS_LINE" >>/etc/hosts
  fi

  host=$(hostname -s 2>/dev/null || uname -n)
  host=${host%%.*}
  pass=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
  write_configs "$host" "$pass"

  start_munge
  start_mariadb "$pass"

  start_bg slurmdbd slurmdbd -D
  wait_until 30 slurmdbd slurmdbd dbd_ok
  # slurmctld registers with slurmdbd under ClusterName; the cluster must exist first.
  sacctmgr -i add cluster "$CLUSTER" >"$D/log/sacctmgr.log" 2>&1
  log "slurmdbd up (port $DBD_PORT), cluster '$CLUSTER' registered"

  # -i: ignore unreadable saved state (the state dir is fresh anyway, jobs do not survive down).
  start_bg slurmctld slurmctld -D -i
  for n in "${NODES[@]}"; do
    start_bg "slurmd-$n" slurmd -D -N "$n"
  done
  wait_until 60 "nodes n1, n2 to be idle" slurmctld nodes_ok

  printf 'export SLURM_CONF=%s\n' "$D/slurm.conf" >"$D/env"
  log "up: partition debug, nodes n1 n2 (4 CPUs each); logs in $D/log"
  log "clients need SLURM_CONF (or: source $D/env):"
  cat "$D/env"
}

on_up_exit() {
  local rc=$? f
  ((rc != 0)) && [[ -f $D/$MARKER ]] || return 0
  log "bring-up failed (rc=$rc); last log lines:"
  for f in "$D"/log/*.log "$D"/log/*.out; do
    [[ -s $f ]] || continue
    printf '==> %s <==\n' "$f" >&2
    tail -n 5 "$f" >&2
  done
  log "state kept in $D for inspection; 'bash $SELF down' cleans up (up also does)"
}

# ---------------------------------------------------------------- status
do_status() {
  local name pid ok=0
  if [[ ! -f $D/$MARKER ]]; then
    echo "local SLURM cluster: not up (no state in $D)"
    return 1
  fi
  for name in "${STOP_ORDER[@]}"; do
    pid=$(recorded_pid "$name")
    if [[ -z $pid ]]; then
      if [[ $name == munged ]]; then
        echo "munged     (not ours: a munged already running was reused)"
      else
        printf '%-10s no PID recorded\n' "$name"
        ok=1
      fi
    elif alive "$name" "$pid"; then
      printf '%-10s %-8s alive\n' "$name" "$pid"
    else
      printf '%-10s %-8s DEAD\n' "$name" "$pid"
      ok=1
    fi
  done
  timeout 10 sinfo || ok=1
  nodes_ok || ok=1
  if ((ok == 0)); then echo "local SLURM cluster: up (export SLURM_CONF=$D/slurm.conf)"
  else echo "local SLURM cluster: NOT healthy (logs in $D/log)"; fi
  return "$ok"
}

# ---------------------------------------------------------------- main
cmd=${1:-}
case $cmd in
  up)
    if ((EUID != 0)); then
      if healthy; then   # nothing to do, so no root needed
        log "already up and healthy ($D); nothing to do"
        printf 'export SLURM_CONF=%s\n' "$D/slurm.conf"
        exit 0
      fi
      m=$(missing_pkgs | tr '\n' ' ')
      if [[ -n $m ]] && ! can_sudo; then
        die 2 "not root, and packages are missing: ${m}- run this as root, or apt-get install them"
      fi
      need_root up
    fi
    ;;
  down)
    # Nothing of ours anywhere: a no-op, even without root.
    if [[ ! -e $D/$MARKER ]] && ! grep -qxF "$HOSTS_LINE" /etc/hosts 2>/dev/null; then
      log "nothing to stop ($D absent)"
      exit 0
    fi
    need_root down
    ;;
  status) do_status; exit ;;
  *) echo "usage: $0 up|down|status   (state dir: \$LCAB_SLURM_DIR, default /tmp/lcab-slurm)" >&2; exit 2 ;;
esac

# One up/down at a time on this machine: lock the script file itself, so no lock file is left
# behind. Daemons drop fd 9 at start (start_bg, munged), else they would hold the lock forever.
exec 9<"$SELF"
flock -w 120 9 || die 1 "another slurm_local.sh up/down has held the lock for 120 s"

if [[ $cmd == up ]]; then
  trap on_up_exit EXIT
  do_up
else
  do_down
fi
