# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_consem_global_optspecs
    string join \n h/help V/version
end

function __fish_consem_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_consem_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_consem_using_subcommand
    set -l cmd (__fish_consem_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c consem -n "__fish_consem_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c consem -n "__fish_consem_needs_command" -s V -l version -d 'Print version'
complete -c consem -n "__fish_consem_needs_command" -f -a "run" -d 'Run a command while holding a slot'
complete -c consem -n "__fish_consem_needs_command" -f -a "status" -d 'Show a semaphore (limit, holders, waiters), or list every one under a root'
complete -c consem -n "__fish_consem_needs_command" -f -a "release" -d 'Free a slot: take a holder out of the record (Consul: and destroy its session)'
complete -c consem -n "__fish_consem_needs_command" -f -a "reset" -d 'Drop the limit record once no live holder remains, so that a new limit can be used'
complete -c consem -n "__fish_consem_needs_command" -f -a "completions" -d 'Print a shell completion script'
complete -c consem -n "__fish_consem_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c consem -n "__fish_consem_using_subcommand run" -l prefix -d 'Name all contenders agree on (a KV prefix on Consul)' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l limit -d 'Number of slots; every contender on the prefix must use the same limit' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l timeout -d 'Give up waiting for a slot after this long, saying why (default: wait forever)' -r
complete -c consem -n "__fish_consem_using_subcommand run" -s E -l no-slot-exit-code -d 'Exit code when no slot was obtained' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l log-format -d 'Format of what consem writes on stderr' -r -f -a "text\t'`<time> consem[<pid>] <event> key=value ...`; errors as `consem: error: ...`'
json\t'One JSON object per line: time, pid, level, event or message, details'"
complete -c consem -n "__fish_consem_using_subcommand run" -l kill-grace -d 'Time between SIGTERM and SIGKILL when consem must stop the command' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l ttl -d 'The lease of a slot, renewed every TTL/3 (default 15s)' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l monitor-retry -d 'Give a held slot up after N failed attempts in a row to reach the store (default: keep trying while the slot\'s lease lasts)' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l name -d 'Session name (default: "consem: <command> at <prefix>")' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l redis-wait-replicas -d 'Use a slot, and count each renewal, only once N replicas have acknowledged it' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l store -d 'Where the semaphore lives: consul, local, redis://host:port, etcd://host:port, postgres://host/database or zk://host:port [default: CONSEM_STORE, else consul]' -r -f -a "consul\t''
local\t''
local:\t''
redis://\t''
rediss://\t''
redis+sentinel://\t''
rediss+sentinel://\t''
etcd://\t''
etcds://\t''
postgres://\t''
postgresql://\t''
zk://\t''
zks://\t''"
complete -c consem -n "__fish_consem_using_subcommand run" -l http-addr -d 'Consul HTTP API address: host:port, http://host:port or https://host:port (host:port means https with CONSUL_HTTP_SSL=true) [default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500]' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l token -d 'ACL token, sent in the X-Consul-Token header [default: CONSUL_HTTP_TOKEN]; HTTP basic auth, if the agent sits behind it, comes from CONSUL_HTTP_AUTH (user:password)' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l token-file -d 'File holding the ACL token; wins over a token [default: CONSUL_HTTP_TOKEN_FILE]' -r -F
complete -c consem -n "__fish_consem_using_subcommand run" -l datacenter -d 'Datacenter to use (default: the agent\'s)' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l namespace -d 'Namespace to use (Consul Enterprise) [default: CONSUL_NAMESPACE]' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l partition -d 'Admin partition to use (Consul Enterprise) [default: CONSUL_PARTITION]' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l ca-file -d 'PEM file of the CA that signs the agent\'s certificate [default: CONSUL_CACERT, else the system\'s trust store]; CONSUL_HTTP_SSL_VERIFY=false turns checking off' -r -F
complete -c consem -n "__fish_consem_using_subcommand run" -l ca-path -d 'Directory of PEM CA certificates [default: CONSUL_CAPATH]' -r -F
complete -c consem -n "__fish_consem_using_subcommand run" -l client-cert -d 'PEM client certificate, for agents that verify clients (mTLS) [default: CONSUL_CLIENT_CERT]' -r -F
complete -c consem -n "__fish_consem_using_subcommand run" -l client-key -d 'PEM private key of the client certificate [default: CONSUL_CLIENT_KEY]' -r -F
complete -c consem -n "__fish_consem_using_subcommand run" -l tls-server-name -d 'Name to verify the agent\'s certificate against, instead of the address\'s host [default: CONSUL_TLS_SERVER_NAME]' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l user -d 'User to sign in as, with its password after a colon or in --password (etcd; ZooKeeper\'s digest, as zkCli\'s addauth) [default: etcd: ETCDCTL_USER]' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l password -d 'Password of --user [default: etcd: ETCDCTL_PASSWORD]' -r
complete -c consem -n "__fish_consem_using_subcommand run" -l cacert -d 'PEM file of the CA that signs the servers\' certificates (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CACERT; else the system\'s trust store]' -r -F
complete -c consem -n "__fish_consem_using_subcommand run" -l cert -d 'PEM client certificate, for servers that verify clients (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CERT]' -r -F
complete -c consem -n "__fish_consem_using_subcommand run" -l key -d 'PEM private key of the client certificate [default: etcd: ETCDCTL_KEY]' -r -F
complete -c consem -n "__fish_consem_using_subcommand run" -l try -d 'Make one attempt and do not wait (quietly; -v says who held the slots)'
complete -c consem -n "__fish_consem_using_subcommand run" -s v -l verbose -d 'Print lifecycle events on stderr, and why --try found no slot'
complete -c consem -n "__fish_consem_using_subcommand run" -s q -l quiet -d 'Leave out the line that says why --timeout ran out'
complete -c consem -n "__fish_consem_using_subcommand run" -l wait-group -d 'Keep the slot until every process in the command\'s process group has exited, instead of stopping them when the command exits'
complete -c consem -n "__fish_consem_using_subcommand run" -l redis-allow-eviction -d 'Run even where Redis may evict any key when its memory is full'
complete -c consem -n "__fish_consem_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c consem -n "__fish_consem_using_subcommand run" -s V -l version -d 'Print version'
complete -c consem -n "__fish_consem_using_subcommand status" -l prefix -d 'Name of the semaphore (a KV prefix on Consul); ending in `/`, or left out: every one under it, or in the store' -r
complete -c consem -n "__fish_consem_using_subcommand status" -l store -d 'Where the semaphore lives: consul, local, redis://host:port, etcd://host:port, postgres://host/database or zk://host:port [default: CONSEM_STORE, else consul]' -r -f -a "consul\t''
local\t''
local:\t''
redis://\t''
rediss://\t''
redis+sentinel://\t''
rediss+sentinel://\t''
etcd://\t''
etcds://\t''
postgres://\t''
postgresql://\t''
zk://\t''
zks://\t''"
complete -c consem -n "__fish_consem_using_subcommand status" -l http-addr -d 'Consul HTTP API address: host:port, http://host:port or https://host:port (host:port means https with CONSUL_HTTP_SSL=true) [default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500]' -r
complete -c consem -n "__fish_consem_using_subcommand status" -l token -d 'ACL token, sent in the X-Consul-Token header [default: CONSUL_HTTP_TOKEN]; HTTP basic auth, if the agent sits behind it, comes from CONSUL_HTTP_AUTH (user:password)' -r
complete -c consem -n "__fish_consem_using_subcommand status" -l token-file -d 'File holding the ACL token; wins over a token [default: CONSUL_HTTP_TOKEN_FILE]' -r -F
complete -c consem -n "__fish_consem_using_subcommand status" -l datacenter -d 'Datacenter to use (default: the agent\'s)' -r
complete -c consem -n "__fish_consem_using_subcommand status" -l namespace -d 'Namespace to use (Consul Enterprise) [default: CONSUL_NAMESPACE]' -r
complete -c consem -n "__fish_consem_using_subcommand status" -l partition -d 'Admin partition to use (Consul Enterprise) [default: CONSUL_PARTITION]' -r
complete -c consem -n "__fish_consem_using_subcommand status" -l ca-file -d 'PEM file of the CA that signs the agent\'s certificate [default: CONSUL_CACERT, else the system\'s trust store]; CONSUL_HTTP_SSL_VERIFY=false turns checking off' -r -F
complete -c consem -n "__fish_consem_using_subcommand status" -l ca-path -d 'Directory of PEM CA certificates [default: CONSUL_CAPATH]' -r -F
complete -c consem -n "__fish_consem_using_subcommand status" -l client-cert -d 'PEM client certificate, for agents that verify clients (mTLS) [default: CONSUL_CLIENT_CERT]' -r -F
complete -c consem -n "__fish_consem_using_subcommand status" -l client-key -d 'PEM private key of the client certificate [default: CONSUL_CLIENT_KEY]' -r -F
complete -c consem -n "__fish_consem_using_subcommand status" -l tls-server-name -d 'Name to verify the agent\'s certificate against, instead of the address\'s host [default: CONSUL_TLS_SERVER_NAME]' -r
complete -c consem -n "__fish_consem_using_subcommand status" -l user -d 'User to sign in as, with its password after a colon or in --password (etcd; ZooKeeper\'s digest, as zkCli\'s addauth) [default: etcd: ETCDCTL_USER]' -r
complete -c consem -n "__fish_consem_using_subcommand status" -l password -d 'Password of --user [default: etcd: ETCDCTL_PASSWORD]' -r
complete -c consem -n "__fish_consem_using_subcommand status" -l cacert -d 'PEM file of the CA that signs the servers\' certificates (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CACERT; else the system\'s trust store]' -r -F
complete -c consem -n "__fish_consem_using_subcommand status" -l cert -d 'PEM client certificate, for servers that verify clients (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CERT]' -r -F
complete -c consem -n "__fish_consem_using_subcommand status" -l key -d 'PEM private key of the client certificate [default: etcd: ETCDCTL_KEY]' -r -F
complete -c consem -n "__fish_consem_using_subcommand status" -l json -d 'Print JSON (a stable schema, see docs/operators.md) instead of a table'
complete -c consem -n "__fish_consem_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c consem -n "__fish_consem_using_subcommand status" -s V -l version -d 'Print version'
complete -c consem -n "__fish_consem_using_subcommand release" -l prefix -d 'Name of the semaphore (a KV prefix on Consul)' -r
complete -c consem -n "__fish_consem_using_subcommand release" -l session -d 'The holder\'s session ID, or a unique beginning of it' -r
complete -c consem -n "__fish_consem_using_subcommand release" -l host -d 'The holder\'s host (with --pid)' -r
complete -c consem -n "__fish_consem_using_subcommand release" -l pid -d 'The holder\'s consem process ID (with --host)' -r
complete -c consem -n "__fish_consem_using_subcommand release" -l store -d 'Where the semaphore lives: consul, local, redis://host:port, etcd://host:port, postgres://host/database or zk://host:port [default: CONSEM_STORE, else consul]' -r -f -a "consul\t''
local\t''
local:\t''
redis://\t''
rediss://\t''
redis+sentinel://\t''
rediss+sentinel://\t''
etcd://\t''
etcds://\t''
postgres://\t''
postgresql://\t''
zk://\t''
zks://\t''"
complete -c consem -n "__fish_consem_using_subcommand release" -l http-addr -d 'Consul HTTP API address: host:port, http://host:port or https://host:port (host:port means https with CONSUL_HTTP_SSL=true) [default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500]' -r
complete -c consem -n "__fish_consem_using_subcommand release" -l token -d 'ACL token, sent in the X-Consul-Token header [default: CONSUL_HTTP_TOKEN]; HTTP basic auth, if the agent sits behind it, comes from CONSUL_HTTP_AUTH (user:password)' -r
complete -c consem -n "__fish_consem_using_subcommand release" -l token-file -d 'File holding the ACL token; wins over a token [default: CONSUL_HTTP_TOKEN_FILE]' -r -F
complete -c consem -n "__fish_consem_using_subcommand release" -l datacenter -d 'Datacenter to use (default: the agent\'s)' -r
complete -c consem -n "__fish_consem_using_subcommand release" -l namespace -d 'Namespace to use (Consul Enterprise) [default: CONSUL_NAMESPACE]' -r
complete -c consem -n "__fish_consem_using_subcommand release" -l partition -d 'Admin partition to use (Consul Enterprise) [default: CONSUL_PARTITION]' -r
complete -c consem -n "__fish_consem_using_subcommand release" -l ca-file -d 'PEM file of the CA that signs the agent\'s certificate [default: CONSUL_CACERT, else the system\'s trust store]; CONSUL_HTTP_SSL_VERIFY=false turns checking off' -r -F
complete -c consem -n "__fish_consem_using_subcommand release" -l ca-path -d 'Directory of PEM CA certificates [default: CONSUL_CAPATH]' -r -F
complete -c consem -n "__fish_consem_using_subcommand release" -l client-cert -d 'PEM client certificate, for agents that verify clients (mTLS) [default: CONSUL_CLIENT_CERT]' -r -F
complete -c consem -n "__fish_consem_using_subcommand release" -l client-key -d 'PEM private key of the client certificate [default: CONSUL_CLIENT_KEY]' -r -F
complete -c consem -n "__fish_consem_using_subcommand release" -l tls-server-name -d 'Name to verify the agent\'s certificate against, instead of the address\'s host [default: CONSUL_TLS_SERVER_NAME]' -r
complete -c consem -n "__fish_consem_using_subcommand release" -l user -d 'User to sign in as, with its password after a colon or in --password (etcd; ZooKeeper\'s digest, as zkCli\'s addauth) [default: etcd: ETCDCTL_USER]' -r
complete -c consem -n "__fish_consem_using_subcommand release" -l password -d 'Password of --user [default: etcd: ETCDCTL_PASSWORD]' -r
complete -c consem -n "__fish_consem_using_subcommand release" -l cacert -d 'PEM file of the CA that signs the servers\' certificates (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CACERT; else the system\'s trust store]' -r -F
complete -c consem -n "__fish_consem_using_subcommand release" -l cert -d 'PEM client certificate, for servers that verify clients (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CERT]' -r -F
complete -c consem -n "__fish_consem_using_subcommand release" -l key -d 'PEM private key of the client certificate [default: etcd: ETCDCTL_KEY]' -r -F
complete -c consem -n "__fish_consem_using_subcommand release" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c consem -n "__fish_consem_using_subcommand release" -s V -l version -d 'Print version'
complete -c consem -n "__fish_consem_using_subcommand reset" -l prefix -d 'Name of the semaphore (a KV prefix on Consul)' -r
complete -c consem -n "__fish_consem_using_subcommand reset" -l store -d 'Where the semaphore lives: consul, local, redis://host:port, etcd://host:port, postgres://host/database or zk://host:port [default: CONSEM_STORE, else consul]' -r -f -a "consul\t''
local\t''
local:\t''
redis://\t''
rediss://\t''
redis+sentinel://\t''
rediss+sentinel://\t''
etcd://\t''
etcds://\t''
postgres://\t''
postgresql://\t''
zk://\t''
zks://\t''"
complete -c consem -n "__fish_consem_using_subcommand reset" -l http-addr -d 'Consul HTTP API address: host:port, http://host:port or https://host:port (host:port means https with CONSUL_HTTP_SSL=true) [default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500]' -r
complete -c consem -n "__fish_consem_using_subcommand reset" -l token -d 'ACL token, sent in the X-Consul-Token header [default: CONSUL_HTTP_TOKEN]; HTTP basic auth, if the agent sits behind it, comes from CONSUL_HTTP_AUTH (user:password)' -r
complete -c consem -n "__fish_consem_using_subcommand reset" -l token-file -d 'File holding the ACL token; wins over a token [default: CONSUL_HTTP_TOKEN_FILE]' -r -F
complete -c consem -n "__fish_consem_using_subcommand reset" -l datacenter -d 'Datacenter to use (default: the agent\'s)' -r
complete -c consem -n "__fish_consem_using_subcommand reset" -l namespace -d 'Namespace to use (Consul Enterprise) [default: CONSUL_NAMESPACE]' -r
complete -c consem -n "__fish_consem_using_subcommand reset" -l partition -d 'Admin partition to use (Consul Enterprise) [default: CONSUL_PARTITION]' -r
complete -c consem -n "__fish_consem_using_subcommand reset" -l ca-file -d 'PEM file of the CA that signs the agent\'s certificate [default: CONSUL_CACERT, else the system\'s trust store]; CONSUL_HTTP_SSL_VERIFY=false turns checking off' -r -F
complete -c consem -n "__fish_consem_using_subcommand reset" -l ca-path -d 'Directory of PEM CA certificates [default: CONSUL_CAPATH]' -r -F
complete -c consem -n "__fish_consem_using_subcommand reset" -l client-cert -d 'PEM client certificate, for agents that verify clients (mTLS) [default: CONSUL_CLIENT_CERT]' -r -F
complete -c consem -n "__fish_consem_using_subcommand reset" -l client-key -d 'PEM private key of the client certificate [default: CONSUL_CLIENT_KEY]' -r -F
complete -c consem -n "__fish_consem_using_subcommand reset" -l tls-server-name -d 'Name to verify the agent\'s certificate against, instead of the address\'s host [default: CONSUL_TLS_SERVER_NAME]' -r
complete -c consem -n "__fish_consem_using_subcommand reset" -l user -d 'User to sign in as, with its password after a colon or in --password (etcd; ZooKeeper\'s digest, as zkCli\'s addauth) [default: etcd: ETCDCTL_USER]' -r
complete -c consem -n "__fish_consem_using_subcommand reset" -l password -d 'Password of --user [default: etcd: ETCDCTL_PASSWORD]' -r
complete -c consem -n "__fish_consem_using_subcommand reset" -l cacert -d 'PEM file of the CA that signs the servers\' certificates (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CACERT; else the system\'s trust store]' -r -F
complete -c consem -n "__fish_consem_using_subcommand reset" -l cert -d 'PEM client certificate, for servers that verify clients (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CERT]' -r -F
complete -c consem -n "__fish_consem_using_subcommand reset" -l key -d 'PEM private key of the client certificate [default: etcd: ETCDCTL_KEY]' -r -F
complete -c consem -n "__fish_consem_using_subcommand reset" -l force -d 'Release every live holder first (their commands are stopped, exit 76)'
complete -c consem -n "__fish_consem_using_subcommand reset" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c consem -n "__fish_consem_using_subcommand reset" -s V -l version -d 'Print version'
complete -c consem -n "__fish_consem_using_subcommand completions" -s h -l help -d 'Print help'
complete -c consem -n "__fish_consem_using_subcommand completions" -s V -l version -d 'Print version'
complete -c consem -n "__fish_consem_using_subcommand help; and not __fish_seen_subcommand_from run status release reset completions help" -f -a "run" -d 'Run a command while holding a slot'
complete -c consem -n "__fish_consem_using_subcommand help; and not __fish_seen_subcommand_from run status release reset completions help" -f -a "status" -d 'Show a semaphore (limit, holders, waiters), or list every one under a root'
complete -c consem -n "__fish_consem_using_subcommand help; and not __fish_seen_subcommand_from run status release reset completions help" -f -a "release" -d 'Free a slot: take a holder out of the record (Consul: and destroy its session)'
complete -c consem -n "__fish_consem_using_subcommand help; and not __fish_seen_subcommand_from run status release reset completions help" -f -a "reset" -d 'Drop the limit record once no live holder remains, so that a new limit can be used'
complete -c consem -n "__fish_consem_using_subcommand help; and not __fish_seen_subcommand_from run status release reset completions help" -f -a "completions" -d 'Print a shell completion script'
complete -c consem -n "__fish_consem_using_subcommand help; and not __fish_seen_subcommand_from run status release reset completions help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
