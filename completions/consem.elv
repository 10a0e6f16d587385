
use builtin;
use str;

set edit:completion:arg-completer[consem] = {|@words|
    fn spaces {|n|
        builtin:repeat $n ' ' | str:join ''
    }
    fn cand {|text desc|
        edit:complex-candidate $text &display=$text' '(spaces (- 14 (wcswidth $text)))$desc
    }
    var command = 'consem'
    for word $words[1..-1] {
        if (str:has-prefix $word '-') {
            break
        }
        set command = $command';'$word
    }
    var completions = [
        &'consem'= {
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
            cand run 'Run a command while holding a slot'
            cand status 'Show a semaphore (limit, holders, waiters), or list every one under a root'
            cand release 'Free a slot: take a holder out of the record (Consul: and destroy its session)'
            cand reset 'Drop the limit record once no live holder remains, so that a new limit can be used'
            cand completions 'Print a shell completion script'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'consem;run'= {
            cand --prefix 'Name all contenders agree on (a KV prefix on Consul)'
            cand --limit 'Number of slots; every contender on the prefix must use the same limit'
            cand --timeout 'Give up waiting for a slot after this long, saying why (default: wait forever)'
            cand -E 'Exit code when no slot was obtained'
            cand --no-slot-exit-code 'Exit code when no slot was obtained'
            cand --log-format 'Format of what consem writes on stderr'
            cand --kill-grace 'Time between SIGTERM and SIGKILL when consem must stop the command'
            cand --ttl 'The lease of a slot, renewed every TTL/3 (default 15s)'
            cand --monitor-retry 'Give a held slot up after N failed attempts in a row to reach the store (default: keep trying while the slot''s lease lasts)'
            cand --name 'Session name (default: "consem: <command> at <prefix>")'
            cand --redis-wait-replicas 'Use a slot, and count each renewal, only once N replicas have acknowledged it'
            cand --store 'Where the semaphore lives: consul, local, redis://host:port, etcd://host:port, postgres://host/database or zk://host:port [default: CONSEM_STORE, else consul]'
            cand --http-addr 'Consul HTTP API address: host:port, http://host:port or https://host:port (host:port means https with CONSUL_HTTP_SSL=true) [default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500]'
            cand --token 'ACL token, sent in the X-Consul-Token header [default: CONSUL_HTTP_TOKEN]; HTTP basic auth, if the agent sits behind it, comes from CONSUL_HTTP_AUTH (user:password)'
            cand --token-file 'File holding the ACL token; wins over a token [default: CONSUL_HTTP_TOKEN_FILE]'
            cand --datacenter 'Datacenter to use (default: the agent''s)'
            cand --namespace 'Namespace to use (Consul Enterprise) [default: CONSUL_NAMESPACE]'
            cand --partition 'Admin partition to use (Consul Enterprise) [default: CONSUL_PARTITION]'
            cand --ca-file 'PEM file of the CA that signs the agent''s certificate [default: CONSUL_CACERT, else the system''s trust store]; CONSUL_HTTP_SSL_VERIFY=false turns checking off'
            cand --ca-path 'Directory of PEM CA certificates [default: CONSUL_CAPATH]'
            cand --client-cert 'PEM client certificate, for agents that verify clients (mTLS) [default: CONSUL_CLIENT_CERT]'
            cand --client-key 'PEM private key of the client certificate [default: CONSUL_CLIENT_KEY]'
            cand --tls-server-name 'Name to verify the agent''s certificate against, instead of the address''s host [default: CONSUL_TLS_SERVER_NAME]'
            cand --user 'User to sign in as, with its password after a colon or in --password (etcd; ZooKeeper''s digest, as zkCli''s addauth) [default: etcd: ETCDCTL_USER]'
            cand --password 'Password of --user [default: etcd: ETCDCTL_PASSWORD]'
            cand --cacert 'PEM file of the CA that signs the servers'' certificates (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CACERT; else the system''s trust store]'
            cand --cert 'PEM client certificate, for servers that verify clients (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CERT]'
            cand --key 'PEM private key of the client certificate [default: etcd: ETCDCTL_KEY]'
            cand --try 'Make one attempt and do not wait (quietly; -v says who held the slots)'
            cand -v 'Print lifecycle events on stderr, and why --try found no slot'
            cand --verbose 'Print lifecycle events on stderr, and why --try found no slot'
            cand -q 'Leave out the line that says why --timeout ran out'
            cand --quiet 'Leave out the line that says why --timeout ran out'
            cand --wait-group 'Keep the slot until every process in the command''s process group has exited, instead of stopping them when the command exits'
            cand --redis-allow-eviction 'Run even where Redis may evict any key when its memory is full'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'consem;status'= {
            cand --prefix 'Name of the semaphore (a KV prefix on Consul); ending in `/`, or left out: every one under it, or in the store'
            cand --store 'Where the semaphore lives: consul, local, redis://host:port, etcd://host:port, postgres://host/database or zk://host:port [default: CONSEM_STORE, else consul]'
            cand --http-addr 'Consul HTTP API address: host:port, http://host:port or https://host:port (host:port means https with CONSUL_HTTP_SSL=true) [default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500]'
            cand --token 'ACL token, sent in the X-Consul-Token header [default: CONSUL_HTTP_TOKEN]; HTTP basic auth, if the agent sits behind it, comes from CONSUL_HTTP_AUTH (user:password)'
            cand --token-file 'File holding the ACL token; wins over a token [default: CONSUL_HTTP_TOKEN_FILE]'
            cand --datacenter 'Datacenter to use (default: the agent''s)'
            cand --namespace 'Namespace to use (Consul Enterprise) [default: CONSUL_NAMESPACE]'
            cand --partition 'Admin partition to use (Consul Enterprise) [default: CONSUL_PARTITION]'
            cand --ca-file 'PEM file of the CA that signs the agent''s certificate [default: CONSUL_CACERT, else the system''s trust store]; CONSUL_HTTP_SSL_VERIFY=false turns checking off'
            cand --ca-path 'Directory of PEM CA certificates [default: CONSUL_CAPATH]'
            cand --client-cert 'PEM client certificate, for agents that verify clients (mTLS) [default: CONSUL_CLIENT_CERT]'
            cand --client-key 'PEM private key of the client certificate [default: CONSUL_CLIENT_KEY]'
            cand --tls-server-name 'Name to verify the agent''s certificate against, instead of the address''s host [default: CONSUL_TLS_SERVER_NAME]'
            cand --user 'User to sign in as, with its password after a colon or in --password (etcd; ZooKeeper''s digest, as zkCli''s addauth) [default: etcd: ETCDCTL_USER]'
            cand --password 'Password of --user [default: etcd: ETCDCTL_PASSWORD]'
            cand --cacert 'PEM file of the CA that signs the servers'' certificates (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CACERT; else the system''s trust store]'
            cand --cert 'PEM client certificate, for servers that verify clients (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CERT]'
            cand --key 'PEM private key of the client certificate [default: etcd: ETCDCTL_KEY]'
            cand --json 'Print JSON (a stable schema, see docs/operators.md) instead of a table'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'consem;release'= {
            cand --prefix 'Name of the semaphore (a KV prefix on Consul)'
            cand --session 'The holder''s session ID, or a unique beginning of it'
            cand --host 'The holder''s host (with --pid)'
            cand --pid 'The holder''s consem process ID (with --host)'
            cand --store 'Where the semaphore lives: consul, local, redis://host:port, etcd://host:port, postgres://host/database or zk://host:port [default: CONSEM_STORE, else consul]'
            cand --http-addr 'Consul HTTP API address: host:port, http://host:port or https://host:port (host:port means https with CONSUL_HTTP_SSL=true) [default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500]'
            cand --token 'ACL token, sent in the X-Consul-Token header [default: CONSUL_HTTP_TOKEN]; HTTP basic auth, if the agent sits behind it, comes from CONSUL_HTTP_AUTH (user:password)'
            cand --token-file 'File holding the ACL token; wins over a token [default: CONSUL_HTTP_TOKEN_FILE]'
            cand --datacenter 'Datacenter to use (default: the agent''s)'
            cand --namespace 'Namespace to use (Consul Enterprise) [default: CONSUL_NAMESPACE]'
            cand --partition 'Admin partition to use (Consul Enterprise) [default: CONSUL_PARTITION]'
            cand --ca-file 'PEM file of the CA that signs the agent''s certificate [default: CONSUL_CACERT, else the system''s trust store]; CONSUL_HTTP_SSL_VERIFY=false turns checking off'
            cand --ca-path 'Directory of PEM CA certificates [default: CONSUL_CAPATH]'
            cand --client-cert 'PEM client certificate, for agents that verify clients (mTLS) [default: CONSUL_CLIENT_CERT]'
            cand --client-key 'PEM private key of the client certificate [default: CONSUL_CLIENT_KEY]'
            cand --tls-server-name 'Name to verify the agent''s certificate against, instead of the address''s host [default: CONSUL_TLS_SERVER_NAME]'
            cand --user 'User to sign in as, with its password after a colon or in --password (etcd; ZooKeeper''s digest, as zkCli''s addauth) [default: etcd: ETCDCTL_USER]'
            cand --password 'Password of --user [default: etcd: ETCDCTL_PASSWORD]'
            cand --cacert 'PEM file of the CA that signs the servers'' certificates (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CACERT; else the system''s trust store]'
            cand --cert 'PEM client certificate, for servers that verify clients (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CERT]'
            cand --key 'PEM private key of the client certificate [default: etcd: ETCDCTL_KEY]'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'consem;reset'= {
            cand --prefix 'Name of the semaphore (a KV prefix on Consul)'
            cand --store 'Where the semaphore lives: consul, local, redis://host:port, etcd://host:port, postgres://host/database or zk://host:port [default: CONSEM_STORE, else consul]'
            cand --http-addr 'Consul HTTP API address: host:port, http://host:port or https://host:port (host:port means https with CONSUL_HTTP_SSL=true) [default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500]'
            cand --token 'ACL token, sent in the X-Consul-Token header [default: CONSUL_HTTP_TOKEN]; HTTP basic auth, if the agent sits behind it, comes from CONSUL_HTTP_AUTH (user:password)'
            cand --token-file 'File holding the ACL token; wins over a token [default: CONSUL_HTTP_TOKEN_FILE]'
            cand --datacenter 'Datacenter to use (default: the agent''s)'
            cand --namespace 'Namespace to use (Consul Enterprise) [default: CONSUL_NAMESPACE]'
            cand --partition 'Admin partition to use (Consul Enterprise) [default: CONSUL_PARTITION]'
            cand --ca-file 'PEM file of the CA that signs the agent''s certificate [default: CONSUL_CACERT, else the system''s trust store]; CONSUL_HTTP_SSL_VERIFY=false turns checking off'
            cand --ca-path 'Directory of PEM CA certificates [default: CONSUL_CAPATH]'
            cand --client-cert 'PEM client certificate, for agents that verify clients (mTLS) [default: CONSUL_CLIENT_CERT]'
            cand --client-key 'PEM private key of the client certificate [default: CONSUL_CLIENT_KEY]'
            cand --tls-server-name 'Name to verify the agent''s certificate against, instead of the address''s host [default: CONSUL_TLS_SERVER_NAME]'
            cand --user 'User to sign in as, with its password after a colon or in --password (etcd; ZooKeeper''s digest, as zkCli''s addauth) [default: etcd: ETCDCTL_USER]'
            cand --password 'Password of --user [default: etcd: ETCDCTL_PASSWORD]'
            cand --cacert 'PEM file of the CA that signs the servers'' certificates (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CACERT; else the system''s trust store]'
            cand --cert 'PEM client certificate, for servers that verify clients (etcds://, rediss://, zks://) [default: etcd: ETCDCTL_CERT]'
            cand --key 'PEM private key of the client certificate [default: etcd: ETCDCTL_KEY]'
            cand --force 'Release every live holder first (their commands are stopped, exit 76)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'consem;completions'= {
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'consem;help'= {
            cand run 'Run a command while holding a slot'
            cand status 'Show a semaphore (limit, holders, waiters), or list every one under a root'
            cand release 'Free a slot: take a holder out of the record (Consul: and destroy its session)'
            cand reset 'Drop the limit record once no live holder remains, so that a new limit can be used'
            cand completions 'Print a shell completion script'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'consem;help;run'= {
        }
        &'consem;help;status'= {
        }
        &'consem;help;release'= {
        }
        &'consem;help;reset'= {
        }
        &'consem;help;completions'= {
        }
        &'consem;help;help'= {
        }
    ]
    $completions[$command]
}
