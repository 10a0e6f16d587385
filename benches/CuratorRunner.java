// A command runner on Apache Curator's InterProcessSemaphoreV2, as a JVM
// started by cron would do it (benches/zookeeper.rs compiles it against
// Debian's jars): connect-string, path, maxLeases, then the command. Takes
// one lease, runs the command with the runner's stdin, stdout and stderr,
// returns the lease, and exits with the command's status.
import java.util.Arrays;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.ExponentialBackoffRetry;

public class CuratorRunner {
    public static void main(String[] args) throws Exception {
        String connect = args[0], path = args[1];
        int maxLeases = Integer.parseInt(args[2]);
        // A session of 15 s, as consem's default --ttl.
        CuratorFramework client = CuratorFrameworkFactory.newClient(
                connect, 15000, 15000, new ExponentialBackoffRetry(100, 3));
        client.start();
        int status;
        try {
            InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, path, maxLeases);
            Lease lease = semaphore.acquire();
            try {
                Process command = new ProcessBuilder(Arrays.asList(args).subList(3, args.length))
                        .inheritIO()
                        .start();
                status = command.waitFor();
            } finally {
                semaphore.returnLease(lease);
            }
        } finally {
            client.close();
        }
        System.exit(status);
    }
}
