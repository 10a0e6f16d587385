
using namespace System.Management.Automation
using namespace System.Management.Automation.Language

Register-ArgumentCompleter -Native -CommandName 'consem' -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)

    $commandElements = $commandAst.CommandElements
    $command = @(
        'consem'
        for ($i = 1; $i -lt $commandElements.Count; $i++) {
            $element = $commandElements[$i]
            if ($element -isnot [StringConstantExpressionAst] -or
                $element.StringConstantType -ne [StringConstantType]::BareWord -or
                $element.Value.StartsWith('-') -or
                $element.Value -eq $wordToComplete) {
                break
        }
        $element.Value
    }) -join ';'

    $completions = @(switch ($command) {
        'consem' {
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('run', 'run', [CompletionResultType]::ParameterValue, 'Run a command while holding a slot')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Show a semaphore (limit, holders, waiters), or list every one under a root')
            [CompletionResult]::new('release', 'release', [CompletionResultType]::ParameterValue, 'Free a slot: take a holder out of the record (Consul: and destroy its session)')
            [CompletionResult]::new('reset', 'reset', [CompletionResultType]::ParameterValue, 'Drop the limit record once no live holder remains, so that a new limit can be used')
            [CompletionResult]::new('completions', 'completions', [CompletionResultType]::ParameterValue, 'Print a shell completion script')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'consem;run' {
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Name all contenders agree on (a KV prefix on Consul)')
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'Number of slots; every contender on the prefix must use the same limit')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Give up waiting for a slot after this long, saying why (default: wait forever)')
            [CompletionResult]::new('-E', '-E ', [CompletionResultType]::ParameterName, 'Exit code when no slot was obtained')
            [CompletionResult]::new('--no-slot-exit-code', '--no-slot-exit-code', [CompletionResultType]::ParameterName, 'Exit code when no slot was obtained')
            [CompletionResult]::new('--log-format', '--log-format', [CompletionResultType]::ParameterName, 'Format of what consem writes on stderr')
            [CompletionResult]::new('--kill-grace', '--kill-grace', [CompletionResultType]::ParameterName, 'Time between SIGTERM and SIGKILL when consem must stop the command')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'The lease of a slot, renewed every TTL/3 (default 15s)')
            [CompletionResult]::new('--monitor-retry', '--monitor-retry', [CompletionResultType]::ParameterName, 'Give a held slot up after N failed attempts in a row to reach the store (default: keep trying while the slot''s lease lasts)')
            [CompletionResult]::new('--name', '--name', [CompletionResultType]::ParameterName, 'Session name (default: "consem: <command> at <prefix>")')
            [CompletionResult]::new('--redis-wait-replicas', '--redis-wait-replicas', [CompletionResultType]::ParameterName, 'Use a slot, and count each renewal, only once N replicas have acknowledged it')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'Where the semaphore lives: consul, local, redis://host:port, etcd://host:port, postgres://host/database or zk://host:port [default: CONSEM_STORE, else consul]')
            [CompletionResult]::new('--http-addr', '--http-addr', [CompletionResultType]::ParameterName, 'Consul HTTP API address: host:port, http://host:port or https://host:port (host:port means https with CONSUL_HTTP_SSL=true) [default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500]')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'ACL token, sent in the X-Consul-Token header [default: CONSUL_HTTP_TOKEN]; HTTP basic auth, if the agent sits behind it, comes from CONSUL_HTTP_AUTH (user:password)')
            [CompletionResult]::new('--token-file', '--token-file', [CompletionResultType]::ParameterName, 'File holding the ACL token; wins over a token [default: CONSUL_HTTP_TOKEN_FILE]')
            [CompletionResult]::new('--datacenter', '--datacenter', [CompletionResultType]::ParameterName, 'Datacenter to use (default: the agent''s)')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'Namespace to use (Consul Enterprise) [default: CONSUL_NAMESPACE]')
            [CompletionResult]::new('--partition', '--partition', [CompletionResultType]::ParameterName, 'Admin partition to use (Consul Enterprise) [default: CONSUL_PARTITION]')
            [CompletionResult]::new('--ca-file', '--ca-file', [CompletionResultType]::ParameterName, 'PEM file of the CA that signs the agent''s certificate [default: CONSUL_CACERT, else the system''s trust store]; CONSUL_HTTP_SSL_VERIFY=false turns checking off')
            [CompletionResult]::new('--ca-path', '--ca-path', [CompletionResultType]::ParameterName, 'Directory of PEM CA certificates [default: CONSUL_CAPATH]')
            [CompletionResult]::new('--client-cert', '--client-cert', [CompletionResultType]::ParameterName, 'PEM client certificate, for agents that verify clients (mTLS) [default: CONSUL_CLIENT_CERT]')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'PEM private key of the client certificate [default: CONSUL_CLIENT_KEY]')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Name to verify the agent''s certificate against, instead of the address''s host [default: CONSUL_TLS_SERVER_NAME]')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'User to sign in as, with its password after a colon or in --password (etcd; ZooKeeper''s digest, as zkCli''s addauth) [default: etcd: ETCDCTL_USER]')
            [CompletionResult]::new('--password', '--password', [CompletionResultType]::ParameterName, 'Password of --user [default: etcd: ETCDCTL_PASSWORD]')
            [CompletionResult]::new('--cacert', '--cacert', [CompletionResultType]::ParameterName, 'PEM file of the CA that signs the servers'' certificates (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CACERT; else the system''s trust store]')
            [CompletionResult]::new('--cert', '--cert', [CompletionResultType]::ParameterName, 'PEM client certificate, for servers that verify clients (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CERT]')
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'PEM private key of the client certificate [default: etcd: ETCDCTL_KEY]')
            [CompletionResult]::new('--try', '--try', [CompletionResultType]::ParameterName, 'Make one attempt and do not wait (quietly; -v says who held the slots)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Print lifecycle events on stderr, and why --try found no slot')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Print lifecycle events on stderr, and why --try found no slot')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Leave out the line that says why --timeout ran out')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Leave out the line that says why --timeout ran out')
            [CompletionResult]::new('--wait-group', '--wait-group', [CompletionResultType]::ParameterName, 'Keep the slot until every process in the command''s process group has exited, instead of stopping them when the command exits')
            [CompletionResult]::new('--redis-allow-eviction', '--redis-allow-eviction', [CompletionResultType]::ParameterName, 'Run even where Redis may evict any key when its memory is full')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'consem;status' {
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Name of the semaphore (a KV prefix on Consul); ending in `/`, or left out: every one under it, or in the store')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'Where the semaphore lives: consul, local, redis://host:port, etcd://host:port, postgres://host/database or zk://host:port [default: CONSEM_STORE, else consul]')
            [CompletionResult]::new('--http-addr', '--http-addr', [CompletionResultType]::ParameterName, 'Consul HTTP API address: host:port, http://host:port or https://host:port (host:port means https with CONSUL_HTTP_SSL=true) [default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500]')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'ACL token, sent in the X-Consul-Token header [default: CONSUL_HTTP_TOKEN]; HTTP basic auth, if the agent sits behind it, comes from CONSUL_HTTP_AUTH (user:password)')
            [CompletionResult]::new('--token-file', '--token-file', [CompletionResultType]::ParameterName, 'File holding the ACL token; wins over a token [default: CONSUL_HTTP_TOKEN_FILE]')
            [CompletionResult]::new('--datacenter', '--datacenter', [CompletionResultType]::ParameterName, 'Datacenter to use (default: the agent''s)')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'Namespace to use (Consul Enterprise) [default: CONSUL_NAMESPACE]')
            [CompletionResult]::new('--partition', '--partition', [CompletionResultType]::ParameterName, 'Admin partition to use (Consul Enterprise) [default: CONSUL_PARTITION]')
            [CompletionResult]::new('--ca-file', '--ca-file', [CompletionResultType]::ParameterName, 'PEM file of the CA that signs the agent''s certificate [default: CONSUL_CACERT, else the system''s trust store]; CONSUL_HTTP_SSL_VERIFY=false turns checking off')
            [CompletionResult]::new('--ca-path', '--ca-path', [CompletionResultType]::ParameterName, 'Directory of PEM CA certificates [default: CONSUL_CAPATH]')
            [CompletionResult]::new('--client-cert', '--client-cert', [CompletionResultType]::ParameterName, 'PEM client certificate, for agents that verify clients (mTLS) [default: CONSUL_CLIENT_CERT]')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'PEM private key of the client certificate [default: CONSUL_CLIENT_KEY]')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Name to verify the agent''s certificate against, instead of the address''s host [default: CONSUL_TLS_SERVER_NAME]')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'User to sign in as, with its password after a colon or in --password (etcd; ZooKeeper''s digest, as zkCli''s addauth) [default: etcd: ETCDCTL_USER]')
            [CompletionResult]::new('--password', '--password', [CompletionResultType]::ParameterName, 'Password of --user [default: etcd: ETCDCTL_PASSWORD]')
            [CompletionResult]::new('--cacert', '--cacert', [CompletionResultType]::ParameterName, 'PEM file of the CA that signs the servers'' certificates (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CACERT; else the system''s trust store]')
            [CompletionResult]::new('--cert', '--cert', [CompletionResultType]::ParameterName, 'PEM client certificate, for servers that verify clients (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CERT]')
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'PEM private key of the client certificate [default: etcd: ETCDCTL_KEY]')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print JSON (a stable schema, see docs/operators.md) instead of a table')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'consem;release' {
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Name of the semaphore (a KV prefix on Consul)')
            [CompletionResult]::new('--session', '--session', [CompletionResultType]::ParameterName, 'The holder''s session ID, or a unique beginning of it')
            [CompletionResult]::new('--host', '--host', [CompletionResultType]::ParameterName, 'The holder''s host (with --pid)')
            [CompletionResult]::new('--pid', '--pid', [CompletionResultType]::ParameterName, 'The holder''s consem process ID (with --host)')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'Where the semaphore lives: consul, local, redis://host:port, etcd://host:port, postgres://host/database or zk://host:port [default: CONSEM_STORE, else consul]')
            [CompletionResult]::new('--http-addr', '--http-addr', [CompletionResultType]::ParameterName, 'Consul HTTP API address: host:port, http://host:port or https://host:port (host:port means https with CONSUL_HTTP_SSL=true) [default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500]')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'ACL token, sent in the X-Consul-Token header [default: CONSUL_HTTP_TOKEN]; HTTP basic auth, if the agent sits behind it, comes from CONSUL_HTTP_AUTH (user:password)')
            [CompletionResult]::new('--token-file', '--token-file', [CompletionResultType]::ParameterName, 'File holding the ACL token; wins over a token [default: CONSUL_HTTP_TOKEN_FILE]')
            [CompletionResult]::new('--datacenter', '--datacenter', [CompletionResultType]::ParameterName, 'Datacenter to use (default: the agent''s)')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'Namespace to use (Consul Enterprise) [default: CONSUL_NAMESPACE]')
            [CompletionResult]::new('--partition', '--partition', [CompletionResultType]::ParameterName, 'Admin partition to use (Consul Enterprise) [default: CONSUL_PARTITION]')
            [CompletionResult]::new('--ca-file', '--ca-file', [CompletionResultType]::ParameterName, 'PEM file of the CA that signs the agent''s certificate [default: CONSUL_CACERT, else the system''s trust store]; CONSUL_HTTP_SSL_VERIFY=false turns checking off')
            [CompletionResult]::new('--ca-path', '--ca-path', [CompletionResultType]::ParameterName, 'Directory of PEM CA certificates [default: CONSUL_CAPATH]')
            [CompletionResult]::new('--client-cert', '--client-cert', [CompletionResultType]::ParameterName, 'PEM client certificate, for agents that verify clients (mTLS) [default: CONSUL_CLIENT_CERT]')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'PEM private key of the client certificate [default: CONSUL_CLIENT_KEY]')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Name to verify the agent''s certificate against, instead of the address''s host [default: CONSUL_TLS_SERVER_NAME]')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'User to sign in as, with its password after a colon or in --password (etcd; ZooKeeper''s digest, as zkCli''s addauth) [default: etcd: ETCDCTL_USER]')
            [CompletionResult]::new('--password', '--password', [CompletionResultType]::ParameterName, 'Password of --user [default: etcd: ETCDCTL_PASSWORD]')
            [CompletionResult]::new('--cacert', '--cacert', [CompletionResultType]::ParameterName, 'PEM file of the CA that signs the servers'' certificates (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CACERT; else the system''s trust store]')
            [CompletionResult]::new('--cert', '--cert', [CompletionResultType]::ParameterName, 'PEM client certificate, for servers that verify clients (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CERT]')
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'PEM private key of the client certificate [default: etcd: ETCDCTL_KEY]')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'consem;reset' {
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Name of the semaphore (a KV prefix on Consul)')
            [CompletionResult]::new('--store', '--store', [CompletionResultType]::ParameterName, 'Where the semaphore lives: consul, local, redis://host:port, etcd://host:port, postgres://host/database or zk://host:port [default: CONSEM_STORE, else consul]')
            [CompletionResult]::new('--http-addr', '--http-addr', [CompletionResultType]::ParameterName, 'Consul HTTP API address: host:port, http://host:port or https://host:port (host:port means https with CONSUL_HTTP_SSL=true) [default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500]')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'ACL token, sent in the X-Consul-Token header [default: CONSUL_HTTP_TOKEN]; HTTP basic auth, if the agent sits behind it, comes from CONSUL_HTTP_AUTH (user:password)')
            [CompletionResult]::new('--token-file', '--token-file', [CompletionResultType]::ParameterName, 'File holding the ACL token; wins over a token [default: CONSUL_HTTP_TOKEN_FILE]')
            [CompletionResult]::new('--datacenter', '--datacenter', [CompletionResultType]::ParameterName, 'Datacenter to use (default: the agent''s)')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'Namespace to use (Consul Enterprise) [default: CONSUL_NAMESPACE]')
            [CompletionResult]::new('--partition', '--partition', [CompletionResultType]::ParameterName, 'Admin partition to use (Consul Enterprise) [default: CONSUL_PARTITION]')
            [CompletionResult]::new('--ca-file', '--ca-file', [CompletionResultType]::ParameterName, 'PEM file of the CA that signs the agent''s certificate [default: CONSUL_CACERT, else the system''s trust store]; CONSUL_HTTP_SSL_VERIFY=false turns checking off')
            [CompletionResult]::new('--ca-path', '--ca-path', [CompletionResultType]::ParameterName, 'Directory of PEM CA certificates [default: CONSUL_CAPATH]')
            [CompletionResult]::new('--client-cert', '--client-cert', [CompletionResultType]::ParameterName, 'PEM client certificate, for agents that verify clients (mTLS) [default: CONSUL_CLIENT_CERT]')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'PEM private key of the client certificate [default: CONSUL_CLIENT_KEY]')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Name to verify the agent''s certificate against, instead of the address''s host [default: CONSUL_TLS_SERVER_NAME]')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'User to sign in as, with its password after a colon or in --password (etcd; ZooKeeper''s digest, as zkCli''s addauth) [default: etcd: ETCDCTL_USER]')
            [CompletionResult]::new('--password', '--password', [CompletionResultType]::ParameterName, 'Password of --user [default: etcd: ETCDCTL_PASSWORD]')
            [CompletionResult]::new('--cacert', '--cacert', [CompletionResultType]::ParameterName, 'PEM file of the CA that signs the servers'' certificates (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CACERT; else the system''s trust store]')
            [CompletionResult]::new('--cert', '--cert', [CompletionResultType]::ParameterName, 'PEM client certificate, for servers that verify clients (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CERT]')
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'PEM private key of the client certificate [default: etcd: ETCDCTL_KEY]')
            [CompletionResult]::new('--force', '--force', [CompletionResultType]::ParameterName, 'Release every live holder first (their commands are stopped, exit 76)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'consem;completions' {
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'consem;help' {
            [CompletionResult]::new('run', 'run', [CompletionResultType]::ParameterValue, 'Run a command while holding a slot')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Show a semaphore (limit, holders, waiters), or list every one under a root')
            [CompletionResult]::new('release', 'release', [CompletionResultType]::ParameterValue, 'Free a slot: take a holder out of the record (Consul: and destroy its session)')
            [CompletionResult]::new('reset', 'reset', [CompletionResultType]::ParameterValue, 'Drop the limit record once no live holder remains, so that a new limit can be used')
            [CompletionResult]::new('completions', 'completions', [CompletionResultType]::ParameterValue, 'Print a shell completion script')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'consem;help;run' {
            break
        }
        'consem;help;status' {
            break
        }
        'consem;help;release' {
            break
        }
        'consem;help;reset' {
            break
        }
        'consem;help;completions' {
            break
        }
        'consem;help;help' {
            break
        }
    })

    $completions.Where{ $_.CompletionText -like "$wordToComplete*" } |
        Sort-Object -Property ListItemText
}
